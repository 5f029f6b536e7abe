//! Connections to the cluster database, and the bounds every statement
//! sent on them keeps.
//!
//! Invariants owned here: every call a node makes is bounded by
//! [`CALL_TIMEOUT`] (a hung database is an unavailable one, never a hung
//! node); a call the node gave up on leaves nothing running on its
//! connections, which are cancelled and closed, never handed to another
//! call ([`Connection`]); the server ends each statement itself after
//! [`STATEMENT_TIMEOUT`] in any case (a cancel can be lost), set on each
//! connection as it opens (a `SET`, which a pooler in session mode passes
//! on, where a startup parameter would be refused); the lease's
//! statements have a connection of their own ([`Postgres::for_lease`]),
//! so no statement of the data's (a commit waiting on a lock) delays a
//! renewal; each connection is a server session of its own, which a node
//! checks as it connects: a pooler that shares one session between
//! connections (in transaction or statement mode) would move each
//! connection's setting, prepared statements and cancel key to other
//! connections, so it is refused by name ([`SESSION_PROBES`]); a
//! connection error, a timeout and a server that is shutting down are all
//! [`CoordError::Unavailable`]; a URL is never said with its password.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_postgres::CancelToken;

use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;

use super::Postgres;
use crate::coordinator::CoordError;
use crate::error_code::with_causes;

/// Connections one node keeps to PostgreSQL at most: every actor shipping
/// at once shares them, and PostgreSQL's default allows 100 in all.
pub const POOL_SIZE: usize = 16;

/// The longest one statement may take, connecting included, before the
/// database counts as unavailable: long enough for a commit behind a slow
/// fsync, short enough that a caller gets a named error instead of waiting.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the server runs one statement before it cancels it: half a
/// second under [`CALL_TIMEOUT`], so a statement sent as its call began
/// ends in the database before the node stops waiting for it, and one sent
/// later outlives the node's wait by less than this. Without it, a
/// statement the node gave up on (one waiting on a lock, say) would run on
/// and hold its pooled connection, and every statement sent on that
/// connection after it would wait behind it.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_millis(4_500);

/// Connections the lease keeps, apart from the pool: its register, renew
/// and release statements are sent one at a time.
pub const LEASE_POOL_SIZE: usize = 1;

/// How long a new connection may take to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Pairs of connections a node tries as it connects, each pair open at
/// once. In session mode a pooler gives each connection its own server
/// session: no pair ever shares one, and what one connection sets stays
/// set for it. In transaction mode neither holds: an idle pooler hands
/// the session a connection just let go of to the next one (PgBouncer
/// reuses its server connections last in, first out), so the pair
/// shares it; one that rotates its sessions (busy, or round robin) gives
/// a connection's next statement another session, which lacks what the
/// statement before set. A few pairs, not one, so that either shows.
pub const SESSION_PROBES: usize = 3;

/// The setting a node's probe sets on a connection and reads back
/// ([`SESSION_PROBES`]): a placeholder of its own, which no server or
/// pooler knows or carries between sessions.
const PROBE_SETTING: &str = "weir.session_probe";

/// What a node says of a pooler that shares server sessions.
pub const SHARED_SESSIONS: &str = "the node's connections do not keep a server session each \
     (a pooler in transaction or statement mode, such as PgBouncer's pool_mode = transaction?): \
     a node needs a session of its own on each connection; pool by session";

pub(super) fn unavailable(e: impl std::error::Error) -> CoordError {
    CoordError::Unavailable(with_causes(&e))
}

/// Sorts a database error: what says the server or the connection is gone
/// (or going) is unavailability; anything else is a refusal.
pub(super) fn classify(e: tokio_postgres::Error) -> CoordError {
    let gone = e.is_closed()
        || e.code().is_none()
        || e.code().is_some_and(|c| {
            [
                SqlState::ADMIN_SHUTDOWN,
                SqlState::CRASH_SHUTDOWN,
                SqlState::CANNOT_CONNECT_NOW,
                SqlState::CONNECTION_FAILURE,
                SqlState::CONNECTION_EXCEPTION,
                SqlState::T_R_SERIALIZATION_FAILURE,
                SqlState::T_R_DEADLOCK_DETECTED,
                SqlState::QUERY_CANCELED,
            ]
            .contains(c)
        });
    if gone {
        unavailable(e)
    } else {
        CoordError::Refused(with_causes(&e))
    }
}

/// A database URL with its password replaced, for messages and logs.
/// True when the connection string `url` holds a password itself.
pub fn has_password(url: &str) -> bool {
    url.parse::<tokio_postgres::Config>()
        .is_ok_and(|config| config.get_password().is_some())
}

pub fn redacted(url: &str) -> String {
    match url.parse::<tokio_postgres::Config>() {
        Ok(config) => {
            // One port for all hosts, one per host, or none (the default).
            let ports = config.get_ports();
            let port = |i: usize| match ports {
                [] => None,
                [one] => Some(*one),
                many => many.get(i).copied(),
            };
            let hosts: Vec<String> = config
                .get_hosts()
                .iter()
                .enumerate()
                .map(|(i, h)| {
                    let host = match h {
                        tokio_postgres::config::Host::Tcp(h) => h.clone(),
                        tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
                    };
                    match port(i) {
                        Some(port) => format!("{host}:{port}"),
                        None => host,
                    }
                })
                .collect();
            format!(
                "postgres://{}@{}/{}",
                config.get_user().unwrap_or(""),
                hosts.join(","),
                config.get_dbname().unwrap_or("")
            )
        }
        Err(_) => "<an unreadable database URL>".into(),
    }
}

impl Postgres {
    /// Connects to the database at `url` and makes sure its schema exists,
    /// waiting up to `schema_patience` for a change whose tables others
    /// hold.
    pub async fn connect(url: &str, schema_patience: Duration) -> Result<Postgres, CoordError> {
        let postgres = Postgres::pooled(url, POOL_SIZE)?;
        timed(postgres.refuse_shared_sessions()).await?;
        postgres.migrate(schema_patience).await?;
        Ok(postgres)
    }

    /// Refuses a database whose connections share a server session
    /// ([`SESSION_PROBES`]), before anything is written to it.
    async fn refuse_shared_sessions(&self) -> Result<(), CoordError> {
        for probe in 0..SESSION_PROBES {
            let (a, b) = (self.client().await?, self.client().await?);
            let mark = format!("{}-{probe}", std::process::id());
            // Set, then read back by the very next statement: a pooler
            // that rotates its sessions runs the two in different ones.
            one_row(
                &a,
                &format!("SELECT set_config('{PROBE_SETTING}', '{mark}', false)"),
            )
            .await?;
            let kept = one_row(
                &a,
                &format!("SELECT current_setting('{PROBE_SETTING}', true)"),
            )
            .await?
                == mark;
            let shared = one_row(&a, "SELECT pg_backend_pid()::text").await?
                == one_row(&b, "SELECT pg_backend_pid()::text").await?;
            if shared || !kept {
                return Err(CoordError::Refused(SHARED_SESSIONS.into()));
            }
        }
        Ok(())
    }

    /// The coordinator the node's lease uses (the schema made by
    /// [`Postgres::connect`]): [`LEASE_POOL_SIZE`] connections of its own,
    /// so its renewals never wait for a connection, or behind a statement,
    /// of the actors' storage.
    pub fn for_lease(url: &str) -> Result<Postgres, CoordError> {
        Postgres::pooled(url, LEASE_POOL_SIZE)
    }

    /// A pool of at most `size` connections to `url` (made as they are
    /// first needed), each with the server's [`STATEMENT_TIMEOUT`] set
    /// as it opens.
    fn pooled(url: &str, size: usize) -> Result<Postgres, CoordError> {
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| CoordError::Refused(format!("{}: {e}", redacted(url))))?;
        super::password::fill(&mut config);
        config.connect_timeout(CONNECT_TIMEOUT);
        config.application_name("weir");
        let cancel_at = match (config.get_hosts(), config.get_ports()) {
            ([tokio_postgres::config::Host::Tcp(host), ..], ports) => Some(Arc::new((
                host.clone(),
                ports.first().copied().unwrap_or(5432),
            ))),
            _ => None,
        };
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(size)
            // The connection let go of last is taken first: under a light
            // load a node keeps using the same few, whose prepared
            // statements are cached, so a call's statements go out at once
            // rather than after a round trip to prepare them (and a commit
            // sent as the database stalls is in its queue when it answers
            // again, not a prepare waiting for its answer).
            .queue_mode(deadpool_postgres::QueueMode::Lifo)
            .wait_timeout(Some(CALL_TIMEOUT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .post_create(Hook::async_fn(|client, _| {
                // Sent on the connection once it is open, not as a startup
                // parameter (`options`), which a pooler such as PgBouncer
                // refuses or drops.
                Box::pin(async move {
                    let bound =
                        format!("SET statement_timeout = {}", STATEMENT_TIMEOUT.as_millis());
                    client
                        .batch_execute(&bound)
                        .await
                        .map_err(HookError::Backend)
                })
            }))
            .build()
            .map_err(unavailable)?;
        Ok(Postgres {
            connections: Connections { pool, cancel_at },
        })
    }

    /// A connection of the pool, for one call.
    pub(super) async fn client(&self) -> Result<Connection, CoordError> {
        self.connections.get().await
    }
}

/// The one value `sql` answers on `client`, by the simple query protocol:
/// no statement is prepared, which a pooler in transaction mode could not
/// keep either. A NULL is the empty string.
async fn one_row(client: &Connection, sql: &str) -> Result<String, CoordError> {
    let messages = client.simple_query(sql).await.map_err(classify)?;
    messages
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => {
                Some(row.get(0).unwrap_or_default().to_string())
            }
            _ => None,
        })
        .ok_or_else(|| CoordError::Refused(format!("`{sql}` returned no row")))
}

/// The pool of one [`Postgres`], and where a cancel for its connections
/// goes.
#[derive(Clone)]
pub(super) struct Connections {
    pool: Pool,
    /// The host and port of a URL whose first host is one on the network.
    cancel_at: Option<Arc<(String, u16)>>,
}

impl Connections {
    /// Takes a connection for the call under way.
    pub(super) async fn get(&self) -> Result<Connection, CoordError> {
        let object = self.pool.get().await.map_err(unavailable)?;
        Ok(Connection {
            object: Some(object),
            call: CALL.try_with(Arc::clone).ok(),
            cancel_at: self.cancel_at.clone(),
        })
    }
}

tokio::task_local! {
    /// The call [`timed_for`] bounds, for the connections it takes.
    static CALL: Arc<Call>;
}

/// One call [`timed_for`] bounds.
#[derive(Default)]
struct Call {
    /// The node stopped waiting for it.
    given_up: AtomicBool,
}

/// A pooled connection taken by one call. Dropped with the call when the
/// node gave up on it, it leaves the pool (closed, never taken by another
/// call while a statement of this one may still run on it), and the
/// server is asked to cancel what still runs on it: a statement the node
/// gave up on ends then, not [`STATEMENT_TIMEOUT`] after it was sent, and
/// lets go of its locks.
pub(super) struct Connection {
    object: Option<deadpool_postgres::Object>,
    call: Option<Arc<Call>>,
    cancel_at: Option<Arc<(String, u16)>>,
}

impl std::ops::Deref for Connection {
    type Target = deadpool_postgres::Object;
    fn deref(&self) -> &Self::Target {
        self.object.as_ref().expect("taken until dropped")
    }
}

impl std::ops::DerefMut for Connection {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.object.as_mut().expect("taken until dropped")
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let given_up = self
            .call
            .as_ref()
            .is_some_and(|call| call.given_up.load(Ordering::Acquire));
        let Some(object) = self.object.take() else {
            return;
        };
        if !given_up {
            return;
        }
        let token = object.cancel_token();
        let client = deadpool_postgres::Object::take(object);
        let cancel_at = self.cancel_at.take();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            // The connection is closed after the cancel is through: a
            // pooler (PgBouncer) forwards a cancel only for a client that
            // is still connected.
            runtime.spawn(async move {
                if let Err(e) = cancel(&token, cancel_at.as_deref()).await {
                    tracing::debug!(error = %e, "cannot cancel a statement given up on");
                }
                drop(client);
            });
        }
    }
}

/// Sends the cancel request `token` makes to `at` (else to where the
/// token's connection went), and waits for the server to close the
/// request's socket, as libpq does: PgBouncer before 1.21 drops a cancel
/// whose client half-closes its socket once it is sent, which
/// tokio-postgres's own `cancel_query` does.
async fn cancel(token: &CancelToken, at: Option<&(String, u16)>) -> Result<(), String> {
    let Some((host, port)) = at else {
        return token.cancel_query(NoTls).await.map_err(|e| e.to_string());
    };
    let sent = async {
        let stream = TcpStream::connect((host.as_str(), *port))
            .await
            .map_err(|e| e.to_string())?;
        let mut kept = KeptOpen(stream);
        token
            .cancel_query_raw(&mut kept, NoTls)
            .await
            .map_err(|e| e.to_string())?;
        // Nothing is expected before the close; whatever comes is dropped.
        let mut scratch = [0u8; 64];
        while kept.0.read(&mut scratch).await.map_err(|e| e.to_string())? > 0 {}
        Ok(())
    };
    tokio::time::timeout(CONNECT_TIMEOUT, sent)
        .await
        .map_err(|_| format!("no answer within {} ms", CONNECT_TIMEOUT.as_millis()))?
}

/// A stream whose shutdown leaves it open (see [`cancel`]).
struct KeptOpen(TcpStream);

impl AsyncRead for KeptOpen {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for KeptOpen {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Bounds one call by [`CALL_TIMEOUT`].
pub(super) async fn timed<T>(
    call: impl Future<Output = Result<T, CoordError>>,
) -> Result<T, CoordError> {
    timed_for(CALL_TIMEOUT, call).await
}

/// Bounds one call by `limit`; the connections a call given up on took
/// are closed and what runs on them cancelled ([`Connection`]). A call
/// its caller stops waiting for (the future dropped before it ended: the
/// lease racing a renewal against its own end, say) is given up on too.
pub(super) async fn timed_for<T, E: From<CoordError>>(
    limit: Duration,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    let this = Arc::new(Call::default());
    let call = CALL.scope(this.clone(), call);
    tokio::pin!(call);
    // Declared after `call`, so dropped before it: the connections the
    // call holds see that it was given up on as they are dropped.
    let abandoned = Abandoned(Some(this.clone()));
    let result = tokio::select! {
        result = &mut call => result,
        () = tokio::time::sleep(limit) => {
            // Before the call (and its connections) is dropped.
            this.given_up.store(true, Ordering::Release);
            Err(CoordError::Unavailable(format!(
                "no answer within {} ms",
                limit.as_millis()
            ))
            .into())
        }
    };
    abandoned.finished();
    result
}

/// Marks its call given up on if dropped before [`Abandoned::finished`].
struct Abandoned(Option<Arc<Call>>);

impl Abandoned {
    fn finished(mut self) {
        self.0 = None;
    }
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        if let Some(call) = self.0.take() {
            call.given_up.store(true, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redacted_url_keeps_hosts_and_ports_but_not_the_password() {
        assert_eq!(
            redacted("postgres://weir:hunter2@10.0.0.5:6432/weir"),
            "postgres://weir@10.0.0.5:6432/weir"
        );
        // The default port, said.
        assert_eq!(
            redacted("postgres://weir@db/weir"),
            "postgres://weir@db:5432/weir"
        );
        assert_eq!(
            redacted("host=a,b port=5433,5434 user=weir password=x dbname=weir"),
            "postgres://weir@a:5433,b:5434/weir"
        );
        assert!(!redacted("postgres://weir:hunter2@db:1/weir").contains("hunter2"));
    }
}
