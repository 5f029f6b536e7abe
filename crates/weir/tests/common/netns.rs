//! Network namespaces of a test's own: each party (a node, the database,
//! the test's client) gets a namespace and an address of its own on one
//! bridge, and the test cuts or degrades the link between any two of
//! them, one direction or both, while every process keeps running. The
//! namespaces are made by the test and removed when it ends; no traffic
//! leaves them (the bridge is in a namespace of its own, with no route
//! out), and this process's own namespace is never touched.
//!
//! This machine's kernel has neither `netem` nor `tc` classifiers, nor
//! VLAN filtering on bridges, so a link is cut the way a switch that lost
//! the path would: each side's neighbour entry for the other is pinned to
//! an address no interface has, and the bridge floods its frames to ports
//! that all drop them. Nothing tells either side; a packet simply never
//! arrives (ARP too), one direction or both. A link is degraded with a
//! token bucket (`tbf`) on both ends of a party's cable: a slow link whose
//! queue holds a few tens of milliseconds, past which packets are dropped
//! (delay and loss, under load).

use std::future::Future;
use std::os::fd::AsRawFd;
use std::process::Command;

/// The subnet of every test's bridge (each test has a bridge of its own,
/// so the same addresses serve every test at once).
const SUBNET: &str = "10.77.0";

/// The namespaces of one test.
pub struct Net {
    /// Unique to this test: the namespaces' names start with it.
    prefix: String,
    parties: Vec<String>,
}

/// A MAC address no interface has: frames sent to it are dropped by
/// every port the bridge floods them to.
const NOWHERE: &str = "02:00:00:00:77:77";

fn ip(args: &[&str]) {
    run("ip", args);
}

fn run(program: &str, args: &[&str]) {
    let out = super::output_within(Command::new(program).args(args), super::EXITS_WITHIN);
    assert!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Net {
    /// A bridge, and a namespace for each of `parties` on it (the `i`th
    /// at `10.77.0.(i+1)`), loopback up in each.
    pub fn new(test: &str, parties: &[&str]) -> Net {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let prefix = format!("weir-{}-{n}-{test}", std::process::id());
        let net = Net {
            prefix,
            parties: parties.iter().map(|p| p.to_string()).collect(),
        };
        let hub = net.hub();
        ip(&["netns", "add", &hub]);
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &hub, "link", "set", "br0", "up"]);
        for (i, party) in parties.iter().enumerate() {
            let ns = net.ns(party);
            let port = format!("p{i}");
            let address = format!("{}/24", net.addr(party));
            ip(&["netns", "add", &ns]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            ip(&[
                "-n", &hub, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                &ns,
            ]);
            ip(&["-n", &hub, "link", "set", &port, "master", "br0", "up"]);
            ip(&["-n", &ns, "addr", "add", &address, "dev", "eth0"]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
        }
        net
    }

    fn hub(&self) -> String {
        format!("{}-hub", self.prefix)
    }

    /// The namespace of `party`.
    pub fn ns(&self, party: &str) -> String {
        assert!(self.parties.iter().any(|p| p == party), "no party {party}");
        format!("{}-{party}", self.prefix)
    }

    fn index(&self, party: &str) -> usize {
        self.parties
            .iter()
            .position(|p| p == party)
            .unwrap_or_else(|| panic!("no party {party}"))
    }

    /// The address of `party`.
    pub fn addr(&self, party: &str) -> String {
        format!("{SUBNET}.{}", self.index(party) + 1)
    }

    /// Where a server of `party` listens ([`super::postgres::At`]).
    pub fn at(&self, party: &str) -> super::postgres::At {
        super::postgres::At {
            netns: Some(self.ns(party)),
            host: self.addr(party),
        }
    }

    /// The MAC address of `party`'s interface.
    fn mac(&self, party: &str) -> String {
        let out = super::output_within(
            Command::new("ip").args(["-n", &self.ns(party), "-j", "link", "show", "eth0"]),
            super::EXITS_WITHIN,
        );
        let links: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("ip -j link is JSON");
        links[0]["address"]
            .as_str()
            .expect("an interface's address")
            .to_string()
    }

    /// Pins `from`'s neighbour entry for `to` to `mac`.
    fn neighbour(&self, from: &str, to: &str, mac: &str) {
        ip(&[
            "-n",
            &self.ns(from),
            "neigh",
            "replace",
            &self.addr(to),
            "lladdr",
            mac,
            "dev",
            "eth0",
            "nud",
            "permanent",
        ]);
    }

    /// Drops every packet between `a` and `b`, both ways, silently.
    pub fn cut(&self, a: &str, b: &str) {
        self.cut_one_way(a, b);
        self.cut_one_way(b, a);
    }

    /// Drops every packet `from` sends to `to`; the other way still works.
    pub fn cut_one_way(&self, from: &str, to: &str) {
        self.neighbour(from, to, NOWHERE);
    }

    /// Puts the link between `a` and `b` back as it was.
    pub fn heal(&self, a: &str, b: &str) {
        self.neighbour(a, b, &self.mac(b));
        self.neighbour(b, a, &self.mac(a));
    }

    /// Makes `party`'s cable slow, both ways: `rate` (`2mbit`), with a
    /// queue of `latency` (`30ms`) past which packets are dropped.
    pub fn degrade(&self, party: &str, rate: &str, latency: &str) {
        let port = format!("p{}", self.index(party));
        for (ns, dev) in [(self.ns(party), "eth0".to_string()), (self.hub(), port)] {
            ip(&[
                "netns", "exec", &ns, "tc", "qdisc", "replace", "dev", &dev, "root", "tbf", "rate",
                rate, "burst", "16kb", "latency", latency,
            ]);
        }
    }

    /// Makes `party`'s cable whole again.
    pub fn restore(&self, party: &str) {
        let port = format!("p{}", self.index(party));
        for (ns, dev) in [(self.ns(party), "eth0".to_string()), (self.hub(), port)] {
            ip(&[
                "netns", "exec", &ns, "tc", "qdisc", "del", "dev", &dev, "root",
            ]);
        }
    }

    /// Runs `body` on a thread of its own that lives in `party`'s
    /// namespace (its sockets are made there), on a runtime of its own,
    /// and returns what it returned; a panic in it is this caller's.
    pub fn run_in<F, Fut, T>(&self, party: &str, body: F) -> T
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T>,
        T: Send + 'static,
    {
        let path = format!("/var/run/netns/{}", self.ns(party));
        let thread = std::thread::spawn(move || {
            enter(&path);
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                // Every thread of the runtime is in the namespace too.
                .on_thread_start(move || enter(&path))
                .build()
                .expect("a runtime");
            runtime.block_on(body())
        });
        match thread.join() {
            Ok(value) => value,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// Moves this thread into the network namespace at `path`.
fn enter(path: &str) {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    // SAFETY: a namespace file's descriptor, and the network namespace
    // type, as setns(2) takes; it changes only this thread's namespace.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
}

impl Drop for Net {
    fn drop(&mut self) {
        // Removing a namespace removes its interfaces; what still runs in
        // one (a server the test dropped first) ended with it.
        for party in self.parties.clone() {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.ns(&party)])
                .status();
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.hub()])
            .status();
    }
}
