//! Counts what arrives on stdin, like `wc`, and prints a checksum of it:
//! the one-shot command example of the README.

use std::io::{Read, Write};

fn main() {
    let mut lines = 0u64;
    let mut words = 0u64;
    let mut bytes = 0u64;
    let mut in_word = false;
    let mut hash = Fnv::default();
    let mut buf = [0u8; 64 << 10];
    let mut stdin = std::io::stdin().lock();
    loop {
        let n = match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                eprintln!("wc: cannot read stdin: {e}");
                std::process::exit(2);
            }
        };
        for &b in &buf[..n] {
            if b == b'\n' {
                lines += 1;
            }
            let space = b.is_ascii_whitespace();
            if !space && !in_word {
                words += 1;
            }
            in_word = !space;
        }
        hash.update(&buf[..n]);
        bytes += n as u64;
    }
    let name = std::env::args().nth(1).unwrap_or_else(|| "-".into());
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "{lines} {words} {bytes} fnv1a64:{:016x} {name}",
        hash.0
    );
}

/// FNV-1a, 64 bits: a checksum small enough to write here.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}
