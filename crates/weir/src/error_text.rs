//! How the binary words an error for a person: the error and each of its
//! causes, each said once.
//!
//! Invariant owned here: no cause appears twice in a message. The library
//! crates' errors say their cause in their own text ("cannot listen on
//! ADDR: Address already in use") and also hand it on as their source, so
//! a plain walk of the chain (anyhow's `{:#}`) repeated the last part of
//! every such message. A cause is added only when the text so far does
//! not already end with it.

use std::fmt::Display;

/// `error` and its causes, outermost first, joined by `": "`, with every
/// cause the text already ends with left out.
pub fn error_text(error: &anyhow::Error) -> String {
    chain_text(error.chain().map(|e| e as &dyn Display))
}

fn chain_text<'a>(chain: impl IntoIterator<Item = &'a dyn Display>) -> String {
    let mut text = String::new();
    for cause in chain {
        let cause = cause.to_string();
        if text.is_empty() {
            text = cause;
        } else if !cause.is_empty() && !text.ends_with(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot listen on {addr}: {source}")]
    struct Listen {
        addr: &'static str,
        source: std::io::Error,
    }

    #[test]
    fn a_cause_the_message_already_says_is_not_said_again() {
        let e = anyhow::Error::new(Listen {
            addr: "127.0.0.1:80",
            source: std::io::Error::new(std::io::ErrorKind::AddrInUse, "Address already in use"),
        });
        // What anyhow's own walk of the chain said.
        assert_eq!(
            format!("{e:#}"),
            "cannot listen on 127.0.0.1:80: Address already in use: Address already in use"
        );
        assert_eq!(
            error_text(&e),
            "cannot listen on 127.0.0.1:80: Address already in use"
        );
    }

    #[test]
    fn context_that_does_not_say_its_cause_keeps_it() {
        let e = anyhow::Error::new(std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "Broken pipe",
        ))
        .context("cannot read the component from stdin")
        .context("weir.toml");
        assert_eq!(
            error_text(&e),
            "weir.toml: cannot read the component from stdin: Broken pipe"
        );
    }

    #[test]
    fn nested_sources_that_each_say_theirs_collapse_to_the_outermost() {
        let inner = Listen {
            addr: "a",
            source: std::io::Error::other("disk full"),
        };
        let outer = format!("actor class `x`: {inner}");
        let chain: Vec<&dyn Display> = vec![&outer, &inner, &"disk full"];
        assert_eq!(
            chain_text(chain),
            "actor class `x`: cannot listen on a: disk full"
        );
        // A cause that only appears inside the text, not at its end, is
        // a different statement and is kept.
        let chain: Vec<&dyn Display> = vec![&"disk full while compiling", &"disk full"];
        assert_eq!(chain_text(chain), "disk full while compiling: disk full");
    }
}
