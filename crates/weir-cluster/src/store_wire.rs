//! Storage calls on the wire: a key-value call or a SQL batch (and its
//! bounds) on its way to the node that owns the store, and what it
//! answered on its way back. They travel inside the [`crate::envelope`].
//!
//! Invariant owned here: a call decodes to exactly what was encoded —
//! every key, byte, parameter and error kind — or is refused as malformed;
//! nothing is defaulted or left over.

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use weir_store::StoreError;
use weir_store::kv_op::{KvAnswer, KvOp};
use weir_store::sql::{BatchError, Statement, StatementResult, Value};
use weir_store::{Entry, KeyPage};

use crate::envelope::Malformed;

/// Items one list in a call carries at most (keys, statements, rows,
/// columns): far above what the store limits let through.
pub const MAX_ITEMS: usize = 1 << 24;

struct Writer(BytesMut);

impl Writer {
    fn new() -> Writer {
        Writer(BytesMut::new())
    }
    fn u8(&mut self, v: u8) {
        self.0.put_u8(v);
    }
    fn u64(&mut self, v: u64) {
        self.0.put_u64(v);
    }
    fn bytes(&mut self, b: &[u8]) {
        self.0.put_u64(b.len() as u64);
        self.0.put_slice(b);
    }
    fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
    fn len(&mut self, n: usize) {
        self.0.put_u64(n as u64);
    }
    fn finish(self) -> Bytes {
        self.0.freeze()
    }
}

struct Reader(Bytes);

impl Reader {
    fn take(&mut self, n: usize) -> Result<Bytes, Malformed> {
        if self.0.remaining() < n {
            return Err(Malformed("truncated"));
        }
        Ok(self.0.split_to(n))
    }
    fn u8(&mut self) -> Result<u8, Malformed> {
        Ok(self.take(1)?[0])
    }
    fn u64(&mut self) -> Result<u64, Malformed> {
        Ok(self.take(8)?.get_u64())
    }
    fn bytes(&mut self) -> Result<Vec<u8>, Malformed> {
        let n = usize::try_from(self.u64()?).map_err(|_| Malformed("a length"))?;
        Ok(self.take(n)?.to_vec())
    }
    fn str(&mut self) -> Result<String, Malformed> {
        String::from_utf8(self.bytes()?).map_err(|_| Malformed("text is not UTF-8"))
    }
    fn len(&mut self) -> Result<usize, Malformed> {
        let n = self.u64()?;
        if n > MAX_ITEMS as u64 {
            return Err(Malformed("too many items"));
        }
        Ok(n as usize)
    }
    fn list<T>(
        &mut self,
        mut item: impl FnMut(&mut Reader) -> Result<T, Malformed>,
    ) -> Result<Vec<T>, Malformed> {
        let n = self.len()?;
        let mut out = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            out.push(item(self)?);
        }
        Ok(out)
    }
    fn done(self) -> Result<(), Malformed> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(Malformed("bytes left over"))
        }
    }
}

/// The bounds a call runs under on the owner: time left until the
/// caller's deadline, and what it may hand back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub left: Option<Duration>,
    pub max_result_bytes: usize,
}

fn put_bounds(w: &mut Writer, b: Bounds) {
    w.u64(
        b.left
            .map_or(u64::MAX, |d| d.as_millis().min(u64::MAX as u128 - 1) as u64),
    );
    w.u64(b.max_result_bytes as u64);
}

fn get_bounds(r: &mut Reader) -> Result<Bounds, Malformed> {
    let left = r.u64()?;
    let max = r.u64()?;
    Ok(Bounds {
        left: (left != u64::MAX).then(|| Duration::from_millis(left)),
        max_result_bytes: usize::try_from(max).map_err(|_| Malformed("a bound"))?,
    })
}

fn put_keys(w: &mut Writer, keys: &[String]) {
    w.len(keys.len());
    for k in keys {
        w.str(k);
    }
}

/// Encodes a key-value call.
pub fn encode_kv(op: &KvOp, bounds: Bounds) -> Bytes {
    let mut w = Writer::new();
    put_bounds(&mut w, bounds);
    match op {
        KvOp::Get(k) => {
            w.u8(0);
            w.str(k);
        }
        KvOp::Set(k, v) => {
            w.u8(1);
            w.str(k);
            w.bytes(v);
        }
        KvOp::Delete(k) => {
            w.u8(2);
            w.str(k);
        }
        KvOp::Exists(k) => {
            w.u8(3);
            w.str(k);
        }
        KvOp::ListKeys(cursor) => {
            w.u8(4);
            w.u64(cursor.map_or(u64::MAX, |c| c.min(u64::MAX - 1)));
        }
        KvOp::Increment(k, delta) => {
            w.u8(5);
            w.str(k);
            w.u64(*delta);
        }
        KvOp::GetMany(keys) => {
            w.u8(6);
            put_keys(&mut w, keys);
        }
        KvOp::SetMany(pairs) => {
            w.u8(7);
            w.len(pairs.len());
            for (k, v) in pairs {
                w.str(k);
                w.bytes(v);
            }
        }
        KvOp::DeleteMany(keys) => {
            w.u8(8);
            put_keys(&mut w, keys);
        }
    }
    w.finish()
}

/// Decodes a key-value call.
pub fn decode_kv(bytes: Bytes) -> Result<(KvOp, Bounds), Malformed> {
    let mut r = Reader(bytes);
    let bounds = get_bounds(&mut r)?;
    let op = match r.u8()? {
        0 => KvOp::Get(r.str()?),
        1 => KvOp::Set(r.str()?, r.bytes()?),
        2 => KvOp::Delete(r.str()?),
        3 => KvOp::Exists(r.str()?),
        4 => {
            let c = r.u64()?;
            KvOp::ListKeys((c != u64::MAX).then_some(c))
        }
        5 => KvOp::Increment(r.str()?, r.u64()?),
        6 => KvOp::GetMany(r.list(Reader::str)?),
        7 => KvOp::SetMany(r.list(|r| Ok((r.str()?, r.bytes()?)))?),
        8 => KvOp::DeleteMany(r.list(Reader::str)?),
        _ => return Err(Malformed("an unknown key-value call")),
    };
    r.done()?;
    Ok((op, bounds))
}

fn put_entry(w: &mut Writer, e: &Option<Entry>) {
    match e {
        None => w.u8(0),
        Some((k, v)) => {
            w.u8(1);
            w.str(k);
            w.bytes(v);
        }
    }
}

/// Encodes what a key-value call answered.
pub fn encode_kv_answer(answer: &Result<KvAnswer, StoreError>) -> Bytes {
    let mut w = Writer::new();
    match answer {
        Ok(KvAnswer::Value(v)) => {
            w.u8(0);
            put_entry(&mut w, &v.clone().map(|v| (String::new(), v)));
        }
        Ok(KvAnswer::Done) => w.u8(1),
        Ok(KvAnswer::Exists(b)) => {
            w.u8(2);
            w.u8(u8::from(*b));
        }
        Ok(KvAnswer::Keys(page)) => {
            w.u8(3);
            put_keys(&mut w, &page.keys);
            w.u64(page.cursor.map_or(u64::MAX, |c| c.min(u64::MAX - 1)));
        }
        Ok(KvAnswer::Count(n)) => {
            w.u8(4);
            w.u64(*n);
        }
        Ok(KvAnswer::Entries(entries)) => {
            w.u8(5);
            w.len(entries.len());
            for e in entries {
                put_entry(&mut w, e);
            }
        }
        Err(StoreError::NoSuchStore(name)) => {
            w.u8(6);
            w.str(name);
        }
        Err(e) => {
            w.u8(7);
            w.str(&e.to_string());
        }
    }
    w.finish()
}

fn get_entry(r: &mut Reader) -> Result<Option<Entry>, Malformed> {
    match r.u8()? {
        0 => Ok(None),
        1 => Ok(Some((r.str()?, r.bytes()?))),
        _ => Err(Malformed("an entry")),
    }
}

/// Decodes what a key-value call answered.
pub fn decode_kv_answer(bytes: Bytes) -> Result<Result<KvAnswer, StoreError>, Malformed> {
    let mut r = Reader(bytes);
    let answer = match r.u8()? {
        0 => Ok(KvAnswer::Value(get_entry(&mut r)?.map(|(_, v)| v))),
        1 => Ok(KvAnswer::Done),
        2 => Ok(KvAnswer::Exists(r.u8()? != 0)),
        3 => {
            let keys = r.list(Reader::str)?;
            let c = r.u64()?;
            Ok(KvAnswer::Keys(KeyPage {
                keys,
                cursor: (c != u64::MAX).then_some(c),
            }))
        }
        4 => Ok(KvAnswer::Count(r.u64()?)),
        5 => Ok(KvAnswer::Entries(r.list(get_entry)?)),
        6 => Err(StoreError::NoSuchStore(r.str()?)),
        7 => Err(StoreError::Unavailable(r.str()?)),
        _ => return Err(Malformed("an unknown key-value answer")),
    };
    r.done()?;
    Ok(answer)
}

fn put_value(w: &mut Writer, v: &Value) {
    match v {
        Value::Null => w.u8(0),
        Value::Integer(i) => {
            w.u8(1);
            w.u64(*i as u64);
        }
        Value::Real(f) => {
            w.u8(2);
            w.u64(f.to_bits());
        }
        Value::Text(t) => {
            w.u8(3);
            w.str(t);
        }
        Value::Blob(b) => {
            w.u8(4);
            w.bytes(b);
        }
    }
}

fn get_value(r: &mut Reader) -> Result<Value, Malformed> {
    Ok(match r.u8()? {
        0 => Value::Null,
        1 => Value::Integer(r.u64()? as i64),
        2 => Value::Real(f64::from_bits(r.u64()?)),
        3 => Value::Text(r.str()?),
        4 => Value::Blob(r.bytes()?),
        _ => return Err(Malformed("a SQL value")),
    })
}

/// Encodes a SQL batch.
pub fn encode_sql(statements: &[Statement], bounds: Bounds) -> Bytes {
    let mut w = Writer::new();
    put_bounds(&mut w, bounds);
    w.len(statements.len());
    for s in statements {
        w.str(&s.sql);
        w.len(s.params.len());
        for p in &s.params {
            put_value(&mut w, p);
        }
    }
    w.finish()
}

/// Decodes a SQL batch.
pub fn decode_sql(bytes: Bytes) -> Result<(Vec<Statement>, Bounds), Malformed> {
    let mut r = Reader(bytes);
    let bounds = get_bounds(&mut r)?;
    let statements = r.list(|r| {
        Ok(Statement {
            sql: r.str()?,
            params: r.list(get_value)?,
        })
    })?;
    r.done()?;
    Ok((statements, bounds))
}

/// Encodes what a SQL batch answered.
pub fn encode_sql_answer(answer: &Result<Vec<StatementResult>, BatchError>) -> Bytes {
    let mut w = Writer::new();
    match answer {
        Ok(results) => {
            w.u8(0);
            w.len(results.len());
            for res in results {
                put_keys(&mut w, &res.columns);
                w.len(res.rows.len());
                for row in &res.rows {
                    w.len(row.len());
                    for v in row {
                        put_value(&mut w, v);
                    }
                }
                w.u64(res.rows_read);
                w.u64(res.rows_written);
                w.u64(res.last_insert_id as u64);
            }
        }
        Err(e) => {
            let (kind, index, count, message) = match e {
                BatchError::NoSuchDatabase(m) => (1, 0, 0, m.clone()),
                BatchError::BatchSize(n) => (2, 0, *n, String::new()),
                BatchError::TooManyParams { index, count } => (3, *index, *count, String::new()),
                BatchError::Statement { index, message } => (4, *index, 0, message.clone()),
                BatchError::Refused { index, message } => (5, *index, 0, message.clone()),
                BatchError::Stopped(m) => (6, 0, 0, m.clone()),
                BatchError::OutcomeUnknown(m) => (7, 0, 0, m.clone()),
                // New in this build; a node of the build before reads an
                // unknown kind as a malformed answer, which it tells as a
                // batch that may have run: the safe side, so the call
                // version need not move for it.
                BatchError::NotRun(m) => (8, 0, 0, m.clone()),
            };
            w.u8(kind);
            w.u64(index as u64);
            w.u64(count as u64);
            w.str(&message);
        }
    }
    w.finish()
}

/// Decodes what a SQL batch answered.
pub fn decode_sql_answer(
    bytes: Bytes,
) -> Result<Result<Vec<StatementResult>, BatchError>, Malformed> {
    let mut r = Reader(bytes);
    let kind = r.u8()?;
    let answer = if kind == 0 {
        Ok(r.list(|r| {
            Ok(StatementResult {
                columns: r.list(Reader::str)?,
                rows: r.list(|r| r.list(get_value))?,
                rows_read: r.u64()?,
                rows_written: r.u64()?,
                last_insert_id: r.u64()? as i64,
            })
        })?)
    } else {
        let index = r.u64()? as usize;
        let count = r.u64()? as usize;
        let message = r.str()?;
        Err(match kind {
            1 => BatchError::NoSuchDatabase(message),
            2 => BatchError::BatchSize(count),
            3 => BatchError::TooManyParams { index, count },
            4 => BatchError::Statement { index, message },
            5 => BatchError::Refused { index, message },
            6 => BatchError::Stopped(message),
            7 => BatchError::OutcomeUnknown(message),
            8 => BatchError::NotRun(message),
            _ => return Err(Malformed("an unknown batch error")),
        })
    };
    r.done()?;
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_value_call_and_answer_round_trips() {
        let bounds = Bounds {
            left: Some(Duration::from_millis(750)),
            max_result_bytes: 4096,
        };
        let ops = [
            KvOp::Get("k".into()),
            KvOp::Set("k".into(), vec![0, 255, 7]),
            KvOp::Delete("".into()),
            KvOp::Exists("é".into()),
            KvOp::ListKeys(None),
            KvOp::ListKeys(Some(1000)),
            KvOp::Increment("n".into(), u64::MAX - 3),
            KvOp::GetMany(vec!["a".into(), "b".into()]),
            KvOp::SetMany(vec![("a".into(), vec![]), ("b".into(), vec![1; 300])]),
            KvOp::DeleteMany(vec![]),
        ];
        for op in ops {
            let (back, b) = decode_kv(encode_kv(&op, bounds)).unwrap();
            assert_eq!(back, op);
            assert_eq!(b, bounds);
        }
        let unbounded = Bounds {
            left: None,
            max_result_bytes: 1,
        };
        assert_eq!(
            decode_kv(encode_kv(&KvOp::Get("x".into()), unbounded))
                .unwrap()
                .1,
            unbounded
        );
        let answers = [
            KvAnswer::Value(None),
            KvAnswer::Value(Some(vec![9; 10])),
            KvAnswer::Done,
            KvAnswer::Exists(true),
            KvAnswer::Keys(KeyPage {
                keys: vec!["a".into()],
                cursor: Some(1),
            }),
            KvAnswer::Keys(KeyPage {
                keys: vec![],
                cursor: None,
            }),
            KvAnswer::Count(42),
            KvAnswer::Entries(vec![None, Some(("k".into(), vec![1]))]),
        ];
        for answer in answers {
            let back = decode_kv_answer(encode_kv_answer(&Ok(answer.clone()))).unwrap();
            assert_eq!(back.unwrap(), answer);
        }
        let missing = decode_kv_answer(encode_kv_answer(&Err(StoreError::NoSuchStore("s".into()))));
        assert!(matches!(missing, Ok(Err(StoreError::NoSuchStore(n))) if n == "s"));
        let failed = decode_kv_answer(encode_kv_answer(&Err(StoreError::KeyTooLarge(70_000))));
        assert!(matches!(failed, Ok(Err(StoreError::Unavailable(m))) if m.contains("70000")));
        // A call with bytes after it is not one.
        let mut extra = encode_kv(&KvOp::Get("k".into()), bounds).to_vec();
        extra.push(0);
        assert!(decode_kv(Bytes::from(extra)).is_err());
    }

    #[test]
    fn every_sql_batch_and_answer_round_trips() {
        let statements = vec![
            Statement {
                sql: "INSERT INTO t VALUES (?1, ?2, ?3, ?4, ?5)".into(),
                params: vec![
                    Value::Null,
                    Value::Integer(-5),
                    Value::Real(1.5),
                    Value::Text("x".into()),
                    Value::Blob(vec![0, 1]),
                ],
            },
            Statement {
                sql: "SELECT 1".into(),
                params: vec![],
            },
        ];
        let bounds = Bounds {
            left: Some(Duration::from_millis(1)),
            max_result_bytes: 10,
        };
        let (back, b) = decode_sql(encode_sql(&statements, bounds)).unwrap();
        assert_eq!(back, statements);
        assert_eq!(b, bounds);
        let results = vec![StatementResult {
            columns: vec!["a".into(), "b".into()],
            rows: vec![vec![Value::Integer(1), Value::Text("t".into())], vec![]],
            rows_read: 2,
            rows_written: 3,
            last_insert_id: -1,
        }];
        let back = decode_sql_answer(encode_sql_answer(&Ok(results.clone()))).unwrap();
        assert_eq!(back.unwrap(), results);
        for e in [
            BatchError::NoSuchDatabase("d".into()),
            BatchError::BatchSize(0),
            BatchError::TooManyParams {
                index: 2,
                count: 99,
            },
            BatchError::Statement {
                index: 1,
                message: "m".into(),
            },
            BatchError::Refused {
                index: 0,
                message: "r".into(),
            },
            BatchError::Stopped("s".into()),
            BatchError::OutcomeUnknown("u".into()),
            BatchError::NotRun("n".into()),
        ] {
            let shown = e.to_string();
            let back = decode_sql_answer(encode_sql_answer(&Err(e))).unwrap();
            assert_eq!(back.unwrap_err().to_string(), shown);
        }
    }
}
