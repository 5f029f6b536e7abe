//! A command for the tests of `weir run`: `cmdprobe <mode> [args…]`.

use std::io::{Read, Write};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map(String::as_str).unwrap_or("");
    match mode {
        // argv, one per line, then the environment, sorted.
        "args" => {
            for a in &args {
                println!("arg {a}");
            }
            let mut env: Vec<_> = std::env::vars().collect();
            env.sort();
            for (k, v) in env {
                println!("env {k}={v}");
            }
        }
        // A process's life: counts its start in /data/starts (when it has
        // a slot), holds MB MiB of memory if told, prints its environment,
        // then answers each stdin line as it comes until stdin ends.
        "hold" => {
            let mb: usize = args.get(2).and_then(|c| c.parse().ok()).unwrap_or(0);
            let held = std::hint::black_box(vec![1u8; mb << 20]);
            if std::path::Path::new("/data").exists() {
                let mut starts = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open("/data/starts")
                    .expect("/data/starts");
                starts.write_all(b"start\n").expect("count the start");
                starts.sync_all().expect("sync the start");
            }
            let mut env: Vec<_> = std::env::vars().collect();
            env.sort();
            for (k, v) in env {
                println!("env {k}={v}");
            }
            for line in std::io::stdin().lines() {
                println!("got {}", line.expect("stdin"));
            }
            println!("stdin closed");
            drop(held);
        }
        // stdin back to stdout, then a line to stderr.
        "cat" => {
            let mut input = Vec::new();
            std::io::stdin().read_to_end(&mut input).expect("stdin");
            std::io::stdout().write_all(&input).expect("stdout");
            eprintln!("cat: {} bytes", input.len());
        }
        "exit" => {
            let code: i32 = args.get(2).and_then(|c| c.parse().ok()).unwrap_or(0);
            println!("exiting with {code}");
            std::process::exit(code);
        }
        "panic" => panic!("cmdprobe was told to panic"),
        // Never ends by itself.
        // A life of MS ms: counts its start in /data/starts (when it has a
        // slot), then sleeps and exits 0.
        "sleep-exit" => {
            let ms: u64 = args.get(2).and_then(|c| c.parse().ok()).unwrap_or(0);
            if std::path::Path::new("/data").exists() {
                let mut starts = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open("/data/starts")
                    .expect("/data/starts");
                starts.write_all(b"start\n").expect("count the start");
                starts.sync_all().expect("sync the start");
            }
            std::thread::sleep(std::time::Duration::from_millis(ms));
            println!("slept {ms} ms");
        }
        "spin" => {
            let mut x = 0u64;
            loop {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
        // Grows its memory until refused.
        "grow" => {
            let mut hold: Vec<Vec<u8>> = Vec::new();
            loop {
                hold.push(vec![1u8; 1 << 20]);
                std::hint::black_box(&hold);
            }
        }
        // Writes without end and ignores every failed write.
        "flood" => {
            let line = [b'x'; 4096];
            let mut out = std::io::stdout();
            loop {
                let _ = out.write_all(&line);
            }
        }
        // Writes N bytes to stdout, then exits 0 (panics if a write fails).
        "write" => {
            let n: usize = args.get(2).and_then(|c| c.parse().ok()).unwrap_or(0);
            std::io::stdout().write_all(&vec![b'y'; n]).expect("write");
        }
        // Tries the host's files: each line says what it got.
        "files" => {
            for path in ["/etc/passwd", "/", ".", "/proc/self/environ", "../"] {
                match std::fs::read_dir(path) {
                    Ok(_) => println!("readdir {path}: open"),
                    Err(e) => println!("readdir {path}: {:?}", e.kind()),
                }
                match std::fs::read(path) {
                    Ok(b) => println!("read {path}: {} bytes", b.len()),
                    Err(e) => println!("read {path}: {:?}", e.kind()),
                }
            }
            match std::fs::write("escape.txt", b"x") {
                Ok(()) => println!("write escape.txt: written"),
                Err(e) => println!("write escape.txt: {:?}", e.kind()),
            }
        }
        // Tries to reach ADDR over TCP and UDP, and to look up a name.
        "sockets" => {
            let addr = args.get(2).cloned().unwrap_or_else(|| "127.0.0.1:1".into());
            match std::net::TcpStream::connect(&addr) {
                Ok(_) => println!("tcp {addr}: connected"),
                Err(e) => println!("tcp {addr}: {:?}", e.kind()),
            }
            match std::net::TcpListener::bind("127.0.0.1:0") {
                Ok(_) => println!("listen: bound"),
                Err(e) => println!("listen: {:?}", e.kind()),
            }
            match std::net::UdpSocket::bind("127.0.0.1:0") {
                Ok(_) => println!("udp: bound"),
                Err(e) => println!("udp: {:?}", e.kind()),
            }
            use std::net::ToSocketAddrs;
            match "localhost:80".to_socket_addrs() {
                Ok(_) => println!("lookup: resolved"),
                Err(e) => println!("lookup: {:?}", e.kind()),
            }
        }
        other => {
            eprintln!("cmdprobe: unknown mode `{other}`");
            std::process::exit(64);
        }
    }
}
