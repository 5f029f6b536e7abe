//! A real PostgreSQL of a test's own, for the cluster tests: `initdb` in
//! a temporary directory, run as an unprivileged user when the tests run
//! as root (as PostgreSQL requires), with what the tests do to it (psql,
//! locks held from another session, a freeze), and a PgBouncer in front of
//! it.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where the PostgreSQL programs are: the newest installed major version.
fn bindir() -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|p| p.join("postgres").is_file())
        .collect();
    found.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    found.pop().unwrap_or_else(|| {
        panic!(
            "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/postgres): \
             the cluster tests run a real one; `.ci/run` installs Debian's `postgresql`"
        )
    })
}

/// Runs as root? PostgreSQL refuses to, so its programs run as `postgres`
/// (the Debian package's user) or, failing that, `nobody`.
fn unprivileged() -> Option<&'static str> {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    if !root {
        return None;
    }
    let exists = |user: &str| {
        Command::new("id")
            .arg(user)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    Some(if exists("postgres") {
        "postgres"
    } else {
        "nobody"
    })
}

/// Runs `program` as `user` (see [`unprivileged`]), or as this process.
fn as_user(user: Option<&str>, program: &Path) -> Command {
    match user {
        Some(user) => {
            let mut c = Command::new("setpriv");
            c.args([
                &format!("--reuid={user}"),
                &format!("--regid={user}"),
                "--init-groups",
            ])
            .arg(program);
            c
        }
        None => Command::new(program),
    }
}

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A PostgreSQL server of one test.
pub struct Postgres {
    dir: PathBuf,
    bin: PathBuf,
    user: Option<&'static str>,
    pub port: u16,
    server: Option<Child>,
    /// Where it listens: loopback, or an address of a network namespace
    /// of the test's own ([`super::netns`]), its programs run in it.
    at: At,
}

/// Where a server of the test listens: a network namespace (`None`: this
/// process's own) and an address in it.
#[derive(Clone, Debug)]
pub struct At {
    pub netns: Option<String>,
    pub host: String,
}

impl At {
    /// Loopback, in this process's own namespace.
    pub fn loopback() -> At {
        At {
            netns: None,
            host: "127.0.0.1".into(),
        }
    }

    /// `command`, run in this namespace.
    pub fn wrap(&self, command: Command) -> Command {
        match &self.netns {
            None => command,
            Some(ns) => {
                let mut wrapped = Command::new("ip");
                wrapped
                    .args(["netns", "exec", ns])
                    .arg(command.get_program())
                    .args(command.get_args());
                wrapped
            }
        }
    }
}

impl Postgres {
    fn command(&self, program: &str) -> Command {
        self.at.wrap(as_user(self.user, &self.bin.join(program)))
    }

    /// A fresh cluster on a free port, started, with a database `weir`.
    pub fn start() -> Postgres {
        Postgres::start_at(At::loopback())
    }

    /// [`Postgres::start`], listening at `at`.
    pub fn start_at(at: At) -> Postgres {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = weir_scratch::dir(&format!("pg-{n}"));
        std::fs::create_dir_all(&dir).unwrap();
        let user = unprivileged();
        if let Some(user) = user {
            let ok = Command::new("chown")
                .args([&format!("{user}:"), dir.to_str().unwrap()])
                .status()
                .unwrap()
                .success();
            assert!(ok, "chown {}", dir.display());
        }
        let mut pg = Postgres {
            dir,
            bin: bindir(),
            user,
            port: free_port(),
            server: None,
            at,
        };
        let mut initdb = pg.command("initdb");
        initdb
            .args([
                "-D",
                pg.data().to_str().unwrap(),
                "-A",
                "trust",
                "-U",
                "weir",
            ])
            .args(["--no-sync", "-E", "UTF8"]);
        let out = super::output_within(&mut initdb, super::EXITS_WITHIN);
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if pg.at.netns.is_some() {
            // Reached from the other namespaces of the test's bridge (and
            // from nowhere else: nothing routes out of it).
            let hba = pg.data().join("pg_hba.conf");
            let rules = std::fs::read_to_string(&hba).unwrap();
            std::fs::write(&hba, format!("{rules}\nhost all all 0.0.0.0/0 trust\n")).unwrap();
        }
        pg.run();
        pg.psql("postgres", "CREATE DATABASE weir");
        pg
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Freezes every process of the server (`SIGSTOP`), as a database
    /// machine that stopped answering would; [`Postgres::thaw`] lets it
    /// run on, its connections and time as they were.
    pub fn freeze(&self) {
        let pid = self.server.as_ref().expect("running").id().to_string();
        let _ = Command::new("pkill").args(["-STOP", "-P", &pid]).status();
        let _ = Command::new("kill").args(["-STOP", &pid]).status();
    }

    /// Lets a frozen server run on.
    pub fn thaw(&self) {
        let pid = self.server.as_ref().expect("running").id().to_string();
        let _ = Command::new("kill").args(["-CONT", &pid]).status();
        let _ = Command::new("pkill").args(["-CONT", "-P", &pid]).status();
    }

    /// Starts the server (again) and waits until it answers.
    pub fn run(&mut self) {
        assert!(self.server.is_none(), "already running");
        let log = std::fs::File::create(self.dir.join(format!("log-{}", self.port))).unwrap();
        let child = self
            .command("postgres")
            .args(["-D", self.data().to_str().unwrap()])
            .args([
                "-p",
                &self.port.to_string(),
                "-k",
                self.dir.to_str().unwrap(),
            ])
            .args([
                "-c",
                &format!("listen_addresses={}", self.at.host),
                "-c",
                "max_connections=200",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("postgres starts");
        self.server = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = self
                .command("pg_isready")
                .args(["-h", &self.at.host, "-p", &self.port.to_string(), "-q"])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return;
            }
            assert!(Instant::now() < deadline, "postgres did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server: `INT` is a fast shutdown (connections cut,
    /// everything committed kept), `QUIT` an immediate one (a crash, as
    /// far as its clients can tell).
    pub fn stop(&mut self, signal: &str) {
        let Some(mut child) = self.server.take() else {
            return;
        };
        let _ = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Makes `user` give its password (scram) when it connects over TCP,
    /// whatever the trust rules after say.
    pub fn require_password(&self, user: &str) {
        let hba = self.data().join("pg_hba.conf");
        let rules = std::fs::read_to_string(&hba).unwrap();
        std::fs::write(
            &hba,
            format!("host all {user} {}/32 scram-sha-256\n{rules}", self.at.host),
        )
        .unwrap();
        self.psql("postgres", "SELECT pg_reload_conf()");
    }

    /// What the server logged since it last started.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join(format!("log-{}", self.port))).unwrap_or_default()
    }

    /// The URL nodes reach it at directly.
    pub fn url(&self) -> String {
        format!("postgres://weir@{}:{}/weir", self.at.host, self.port)
    }

    /// Every row of every table of the cluster's database, as `pg_dump
    /// --data-only` writes them (byte strings in hex).
    pub fn dump(&self) -> String {
        let mut dump = self.at.wrap(Command::new(self.bin.join("pg_dump")));
        dump.args(["-h", &self.at.host, "-p", &self.port.to_string()])
            .args(["-U", "weir", "--data-only", "weir"]);
        let out = super::output_within(&mut dump, super::EXITS_WITHIN);
        assert!(
            out.status.success(),
            "pg_dump: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs `sql` in `db` with psql; its unaligned output, trimmed.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        self.client().psql(db, sql)
    }

    /// A way to run psql against this server from another thread.
    pub fn client(&self) -> Psql {
        Psql {
            bin: self.bin.clone(),
            port: self.port,
            at: self.at.clone(),
        }
    }

    /// Holds `table` of the cluster's database locked (ACCESS EXCLUSIVE)
    /// from another session until the lock is dropped: statements that
    /// read it wait, as on a database that is slow to answer them.
    pub fn lock_table(&self, table: &str) -> Held {
        self.hold(&format!("LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
    }

    /// Holds every table of the cluster's database as `pg_dump` does while
    /// it copies them (ACCESS SHARE, in one transaction) until the lock
    /// is dropped: reads and writes go on, a change of a table waits.
    pub fn back_up(&self) -> Held {
        let tables = self.psql(
            "weir",
            "SELECT string_agg(tablename, ', ' ORDER BY tablename) FROM pg_tables \
             WHERE tablename LIKE 'weir%'",
        );
        assert!(tables.matches(", ").count() > 5, "{tables}");
        self.hold(&format!("LOCK TABLE {tables} IN ACCESS SHARE MODE"))
    }

    /// Runs `sql` in a transaction of another session (its
    /// `application_name` is `psql`), left open, and so holding the locks
    /// `sql` took, until it is dropped.
    pub fn hold(&self, sql: &str) -> Held {
        use std::io::Write;
        let mut session = self
            .at
            .wrap(Command::new(self.bin.join("psql")))
            .args(["-h", &self.at.host, "-p", &self.port.to_string()])
            .args(["-U", "weir", "-d", "weir", "-q", "-v", "ON_ERROR_STOP=1"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("psql runs");
        let stdin = session.stdin.as_mut().unwrap();
        writeln!(stdin, "BEGIN; {sql};").unwrap();
        stdin.flush().unwrap();
        let held = "SELECT count(*) FROM pg_stat_activity \
                    WHERE application_name = 'psql' AND state = 'idle in transaction'";
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.psql("weir", held) != "1" {
            assert!(Instant::now() < deadline, "{sql} did not run");
            assert!(session.try_wait().unwrap().is_none(), "{sql} failed");
            std::thread::sleep(Duration::from_millis(20));
        }
        Held(session)
    }

    /// The node that owns `key` now (by the database's clock), if any.
    pub fn owner(&self, key: &str) -> Option<String> {
        let name = self.psql(
            "weir",
            &format!(
                "SELECT n.name FROM weir_objects o JOIN weir_nodes n ON n.session = o.owner \
                 WHERE o.key = '{key}' AND n.expires_at > now()"
            ),
        );
        (!name.is_empty()).then_some(name)
    }
}

/// Where nodes reach the cluster's database.
pub trait Database {
    /// The URL a node is given (`--cluster`).
    fn url(&self) -> String;
}

impl Database for Postgres {
    fn url(&self) -> String {
        Postgres::url(self)
    }
}

/// A PgBouncer in front of one test's PostgreSQL, with no
/// `ignore_startup_parameters`: what it does not know of a client's
/// startup, it refuses.
pub struct PgBouncer {
    dir: PathBuf,
    port: u16,
    child: Child,
    /// PostgreSQL's programs (its `psql`).
    bin: PathBuf,
}

impl PgBouncer {
    /// Starts one pooling by session in front of `pg` and waits until it
    /// answers.
    pub fn start(pg: &Postgres) -> PgBouncer {
        PgBouncer::pooling(pg, "session", "")
    }

    /// Starts one in front of `pg` with `pool_mode = mode` (`session`,
    /// `transaction` or `statement`) and the settings `more` (lines of
    /// `pgbouncer.ini`), and waits until it answers.
    pub fn pooling(pg: &Postgres, mode: &str, more: &str) -> PgBouncer {
        let bin = PathBuf::from("/usr/sbin/pgbouncer");
        assert!(
            bin.is_file(),
            "PgBouncer is not installed (no {}): `.ci/run` installs Debian's `pgbouncer`",
            bin.display()
        );
        assert!(
            pg.at.netns.is_none(),
            "a PgBouncer runs beside a loopback PostgreSQL"
        );
        let port = free_port();
        let dir = pg.dir.join(format!("pgbouncer-{port}"));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("pgbouncer.ini");
        std::fs::write(
            &config,
            format!(
                "[databases]\n\
                 weir = host=127.0.0.1 port={} dbname=weir user=weir\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = any\n\
                 pool_mode = {mode}\n\
                 max_client_conn = 200\n\
                 default_pool_size = 100\n\
                 logfile = {}\n\
                 {more}",
                pg.port,
                dir.join("pgbouncer.log").display()
            ),
        )
        .unwrap();
        if let Some(user) = pg.user {
            let ok = Command::new("chown")
                .args(["-R", &format!("{user}:"), dir.to_str().unwrap()])
                .status()
                .unwrap()
                .success();
            assert!(ok, "chown {}", dir.display());
        }
        let child = as_user(pg.user, &bin)
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("pgbouncer starts");
        let bin = pg.bin.clone();
        let bouncer = PgBouncer {
            dir,
            port,
            child,
            bin,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "pgbouncer did not start: {}",
                bouncer.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        bouncer
    }

    /// A way to run psql through it.
    pub fn client(&self) -> Psql {
        Psql {
            bin: self.bin.clone(),
            port: self.port,
            at: At::loopback(),
        }
    }

    /// What it logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Database for PgBouncer {
    fn url(&self) -> String {
        format!("postgres://weir@127.0.0.1:{}/weir", self.port)
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// psql against one test's server ([`Postgres::client`]).
#[derive(Clone)]
pub struct Psql {
    bin: PathBuf,
    port: u16,
    at: At,
}

impl Psql {
    /// Runs `sql` in `db`; its unaligned output, trimmed.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let mut psql = self.at.wrap(Command::new(self.bin.join("psql")));
        psql.args([
            "-h",
            &self.at.host,
            "-p",
            &self.port.to_string(),
            "-U",
            "weir",
        ])
        .args(["-d", db, "-At", "-v", "ON_ERROR_STOP=1", "-c", sql]);
        let out = super::output_within(&mut psql, super::EXITS_WITHIN);
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

/// A transaction held open by [`Postgres::hold`]; dropped, it commits,
/// and its locks are released.
pub struct Held(Child);

impl Drop for Held {
    fn drop(&mut self) {
        use std::io::Write;
        if let Some(mut stdin) = self.0.stdin.take() {
            let _ = writeln!(stdin, "COMMIT;");
        }
        let _ = self.0.wait();
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop("QUIT");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A TCP proxy between some nodes and PostgreSQL that can cut the link
/// as a partition does: nothing more crosses it either way, and nothing is
/// closed or reset, so each side sees silence, not an error.
pub struct Partition {
    pub port: u16,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Partition {
    /// A proxy to PostgreSQL on `pg`, passing everything until cut.
    pub fn to(pg: &Postgres) -> Partition {
        use std::sync::atomic::Ordering;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (target, shared) = (pg.port, cut.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let cut = shared.clone();
                std::thread::spawn(move || {
                    // A connection made while cut waits, as a SYN to a
                    // host behind a partition would.
                    while cut.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                        return;
                    };
                    let pipe = |mut from: TcpStream, mut to: TcpStream, cut: std::sync::Arc<std::sync::atomic::AtomicBool>| {
                        use std::io::{Read, Write};
                        let _ = from.set_read_timeout(Some(Duration::from_millis(20)));
                        let mut buf = [0u8; 16384];
                        loop {
                            if cut.load(Ordering::Relaxed) {
                                std::thread::sleep(Duration::from_millis(20));
                                continue;
                            }
                            match from.read(&mut buf) {
                                Ok(0) => {
                                    let _ = to.shutdown(std::net::Shutdown::Write);
                                    return;
                                }
                                Ok(n) => {
                                    // Held, not lost, if the link was cut meanwhile.
                                    while cut.load(Ordering::Relaxed) {
                                        std::thread::sleep(Duration::from_millis(20));
                                    }
                                    if to.write_all(&buf[..n]).is_err() {
                                        return;
                                    }
                                }
                                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                                Err(_) => return,
                            }
                        }
                    };
                    let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                    let up = {
                        let cut = cut.clone();
                        std::thread::spawn(move || pipe(client, server, cut))
                    };
                    pipe(s2, c2, cut);
                    let _ = up.join();
                });
            }
        });
        Partition { port, cut }
    }

    /// Cuts the link: nothing crosses it from now on.
    pub fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Heals the link: what waited crosses, and new connections pass.
    pub fn heal(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Database for Partition {
    fn url(&self) -> String {
        format!("postgres://weir@127.0.0.1:{}/weir", self.port)
    }
}
