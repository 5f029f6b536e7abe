//! An object as the simulated nodes hold it: the writes clients make, the
//! state a node replays from them, the snapshot of that state, and the
//! commits a node's shipper queues (a run of them shipped as one framed
//! entry, taken apart again by the model).

use weir_cluster::shipper::Commit;

/// An object's state as a node holds it: replayed from its log.
#[derive(Clone, Default)]
pub struct State {
    pub head: u64,
    pub checksum: u64,
    /// When its alarm falls due, if it is set and not yet delivered.
    pub alarm: Option<i64>,
}

/// A write: a client's (with its id), or an alarm's delivery.
#[derive(Clone, Copy, Debug)]
pub enum Write {
    Client(u64),
    Alarm,
}

pub fn encode(write: Write, alarm_at: i64) -> Vec<u8> {
    match write {
        Write::Client(id) => {
            let mut v = b"w".to_vec();
            v.extend_from_slice(&id.to_be_bytes());
            v.extend_from_slice(&alarm_at.to_be_bytes());
            v
        }
        Write::Alarm => b"a".to_vec(),
    }
}

/// A node's copy of an object, whole: what a snapshot holds.
pub fn encode_state(state: &State) -> Vec<u8> {
    let mut v = Vec::with_capacity(25);
    v.extend_from_slice(&state.head.to_be_bytes());
    v.extend_from_slice(&state.checksum.to_be_bytes());
    v.push(u8::from(state.alarm.is_some()));
    v.extend_from_slice(&state.alarm.unwrap_or(0).to_be_bytes());
    v
}

pub fn decode_state(bytes: &[u8]) -> State {
    let word = |at: usize| u64::from_be_bytes(bytes[at..at + 8].try_into().unwrap());
    State {
        head: word(0),
        checksum: word(8),
        alarm: (bytes[16] == 1).then(|| word(17) as i64),
    }
}

pub fn replay(state: &mut State, entry: &[u8]) {
    match entry[0] {
        b'w' if state.head == 0 || state.alarm.is_some() => {
            let at = i64::from_be_bytes(entry[9..17].try_into().unwrap());
            state.alarm = state.alarm.or(Some(at));
        }
        b'a' => state.alarm = None,
        _ => {}
    }
    state.head += 1;
    state.checksum = state
        .checksum
        .rotate_left(5)
        .wrapping_add(entry.iter().map(|b| *b as u64).sum::<u64>() + state.head);
}

/// A write as a node's shipper queues it. A run of them goes to the
/// model as one entry, each write framed by its length, and the model
/// takes it apart again ([`unframe`]).
pub struct SimCommit {
    pub head: u64,
    pub checksum: u64,
    pub bytes: Vec<u8>,
}

impl Commit for SimCommit {
    fn head(&self) -> u64 {
        self.head
    }

    fn checksum(&self) -> u64 {
        self.checksum
    }

    fn bytes(&self) -> usize {
        self.bytes.len()
    }

    fn db_bytes(&self) -> u64 {
        0
    }

    fn encode_run(run: &[SimCommit]) -> Result<Vec<u8>, String> {
        let mut framed = Vec::new();
        for commit in run {
            framed.extend_from_slice(&(commit.bytes.len() as u32).to_be_bytes());
            framed.extend_from_slice(&commit.bytes);
        }
        Ok(framed)
    }
}

/// The writes of one shipped entry: each after its length.
pub fn unframe(mut framed: &[u8]) -> Vec<Vec<u8>> {
    let mut writes = Vec::new();
    while framed.len() >= 4 {
        let n = u32::from_be_bytes(framed[..4].try_into().unwrap()) as usize;
        writes.push(framed[4..4 + n].to_vec());
        framed = &framed[4 + n..];
    }
    writes
}
