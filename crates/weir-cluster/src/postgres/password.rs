//! The cluster database's password, where libpq's users keep it: the
//! connection string, else `PGPASSWORD`, else a password file
//! (`PGPASSFILE`, or `~/.pgpass`) in libpq's format.
//!
//! Invariant owned here: a password is taken from a file only if no other
//! user may read or write it (as libpq requires), and it never appears in
//! what Weir logs or answers (see `redacted`).

use std::path::{Path, PathBuf};

use tokio_postgres::config::Host;

/// Sets the password of `config` when its connection string has none: from
/// `PGPASSWORD`, else from the password file's first line that matches
/// its host, port, database and user.
pub fn fill(config: &mut tokio_postgres::Config) {
    if config.get_password().is_some() {
        return;
    }
    if let Ok(password) = std::env::var("PGPASSWORD")
        && !password.is_empty()
    {
        config.password(password);
        return;
    }
    let Some(file) = password_file() else {
        return;
    };
    let Some(text) = readable(&file) else {
        return;
    };
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        _ => "localhost".to_string(),
    };
    let port = config
        .get_ports()
        .first()
        .copied()
        .unwrap_or(5432)
        .to_string();
    let user = config.get_user().unwrap_or_default().to_string();
    let database = config.get_dbname().unwrap_or(&user).to_string();
    if let Some(password) = lookup(&text, [&host, &port, &database, &user]) {
        config.password(password);
    }
}

/// Where the password file is: `PGPASSFILE`, else `~/.pgpass`.
fn password_file() -> Option<PathBuf> {
    match std::env::var_os("PGPASSFILE") {
        Some(file) => Some(PathBuf::from(file)),
        None => std::env::var_os("HOME").map(|home| Path::new(&home).join(".pgpass")),
    }
}

/// The file's text, unless others may read or write it (then it is
/// ignored, as libpq ignores it, with a warning).
fn readable(file: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(file).ok()?;
    if !meta.is_file() {
        return None;
    }
    if meta.mode() & 0o077 != 0 {
        tracing::warn!(file = %file.display(), mode = format!("{:04o}", meta.mode() & 0o777), "ignoring the PostgreSQL password file: others may read or write it (make it 0600)");
        return None;
    }
    std::fs::read_to_string(file).ok()
}

/// The password of the first line matching `wanted` (host, port,
/// database, user), each field matching itself or `*`; `\:` and `\\` are
/// escapes.
fn lookup(text: &str, wanted: [&str; 4]) -> Option<String> {
    for line in text.lines() {
        if line.trim_start().starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fields = split(line);
        if fields.len() != 5 {
            continue;
        }
        if fields[..4]
            .iter()
            .zip(wanted)
            .all(|(field, want)| field == "*" || field == want)
        {
            return Some(fields[4].clone());
        }
    }
    None
}

/// A line's fields, split at unescaped colons.
fn split(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(next) = chars.next() {
                    fields.last_mut().expect("one field").push(next);
                }
            }
            ':' => fields.push(String::new()),
            c => fields.last_mut().expect("one field").push(c),
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_matches_by_each_field_or_a_star_and_colons_escape() {
        let text = "# the database's node user\n\
                    db.example:5432:weir:node:s3cr\\:et\n\
                    *:*:*:other:x\n\
                    127.0.0.1:6543:*:node:local\\\\pw\n";
        assert_eq!(
            lookup(text, ["db.example", "5432", "weir", "node"]).as_deref(),
            Some("s3cr:et")
        );
        assert_eq!(
            lookup(text, ["127.0.0.1", "6543", "any", "node"]).as_deref(),
            Some("local\\pw")
        );
        assert_eq!(lookup(text, ["x", "1", "y", "other"]).as_deref(), Some("x"));
        assert_eq!(lookup(text, ["db.example", "5433", "weir", "node"]), None);
    }
}
