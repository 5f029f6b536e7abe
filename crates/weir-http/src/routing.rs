//! Which app a request is for: the server's route table, swapped whole.
//!
//! Invariants owned here:
//! - a request is matched by its host first and then by its path: of the
//!   routes whose host pattern and path prefix both match, the most
//!   specific host wins (an exact host over `*.example.com` over a route
//!   with no host), then the longest prefix;
//! - a prefix matches whole path segments: `/api` matches `/api` and
//!   `/api/x`, never `/apix`; the app sees the request's whole path;
//! - no two routes of one table have the same host pattern and prefix: a
//!   table that would is refused when it is built, naming both apps;
//! - a request no route matches is answered 404 `no_route` and enters no
//!   app;
//! - the table is replaced whole ([`Router::install`]): a request sees the
//!   old table or the new one, never a mix, and a request already routed
//!   runs on the version it was routed to until it ends.

use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwap;
use weir_actors::ActorHost;
use weir_runtime::{App, WeirError};

use crate::server::ActorRoute;

/// A request no route of the server matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoutingErrorCode {
    /// 404: no app is routed at the request's host and path.
    NoRoute,
}

impl RoutingErrorCode {
    pub const ALL: &'static [RoutingErrorCode] = &[RoutingErrorCode::NoRoute];
}

impl WeirError for RoutingErrorCode {
    fn as_str(self) -> &'static str {
        match self {
            RoutingErrorCode::NoRoute => "no_route",
        }
    }

    fn status(self) -> u16 {
        match self {
            RoutingErrorCode::NoRoute => 404,
        }
    }
}

/// Which hosts a route serves.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HostMatch {
    /// Any host (a route written as a bare path).
    Any,
    /// `*.example.com`: any host under `example.com` (not `example.com`
    /// itself). Stored as `.example.com`.
    Suffix(String),
    /// Exactly this host (lowercase, no port).
    Exact(String),
}

impl HostMatch {
    /// How specific the pattern is: the higher wins.
    fn rank(&self) -> u8 {
        match self {
            HostMatch::Any => 0,
            HostMatch::Suffix(_) => 1,
            HostMatch::Exact(_) => 2,
        }
    }

    fn matches(&self, host: &str) -> bool {
        match self {
            HostMatch::Any => true,
            HostMatch::Suffix(suffix) => host.len() > suffix.len() && host.ends_with(suffix),
            HostMatch::Exact(exact) => host == exact,
        }
    }
}

/// One route as the operator writes it: `[host]/prefix`, for example
/// `/`, `/api`, `example.com/`, `*.example.com/api`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RoutePattern {
    pub host: HostMatch,
    /// Starts with `/`; no trailing slash except the root `/` itself.
    pub prefix: String,
}

/// Why a route pattern was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("route `{pattern}`: {why}")]
pub struct PatternError {
    pub pattern: String,
    pub why: &'static str,
}

impl std::str::FromStr for RoutePattern {
    type Err = PatternError;

    fn from_str(text: &str) -> Result<RoutePattern, PatternError> {
        let refuse = |why| PatternError {
            pattern: text.to_string(),
            why,
        };
        let (host, path) = match text.find('/') {
            Some(slash) => text.split_at(slash),
            None => (text, "/"),
        };
        if path.contains(['?', '#', '*']) || path.contains("//") {
            return Err(refuse("the path is a plain prefix: no query, `*` or `//`"));
        }
        let prefix = match path.strip_suffix('/') {
            Some(trimmed) if !trimmed.is_empty() => trimmed.to_string(),
            _ => path.to_string(),
        };
        let host = host.to_ascii_lowercase();
        let valid_name = |name: &str| {
            !name.is_empty()
                && name.split('.').all(|label| {
                    !label.is_empty()
                        && label.len() <= 63
                        && label
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                })
        };
        let host = if host.is_empty() {
            HostMatch::Any
        } else if let Some(rest) = host.strip_prefix("*.") {
            if !valid_name(rest) {
                return Err(refuse("a wildcard host is `*.` then a host name"));
            }
            HostMatch::Suffix(format!(".{rest}"))
        } else {
            if !valid_name(&host) {
                return Err(refuse(
                    "the host is a name of letters, digits, `-` and `.`, with no port",
                ));
            }
            HostMatch::Exact(host)
        };
        Ok(RoutePattern { host, prefix })
    }
}

impl fmt::Display for RoutePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            HostMatch::Any => {}
            HostMatch::Suffix(suffix) => write!(f, "*{suffix}")?,
            HostMatch::Exact(host) => f.write_str(host)?,
        }
        f.write_str(&self.prefix)
    }
}

impl RoutePattern {
    /// The root of every host: how a single-app server routes.
    pub fn root() -> RoutePattern {
        RoutePattern {
            host: HostMatch::Any,
            prefix: "/".into(),
        }
    }

    /// True when `path` is this prefix or lies under it.
    pub fn covers(&self, path: &str) -> bool {
        self.prefix == "/"
            || path
                .strip_prefix(self.prefix.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }
}

/// What one app serves now: its current version as the transport sees it.
pub struct Served {
    pub name: Arc<str>,
    /// The version's worker: its lanes, generations and queue.
    pub app: Arc<App>,
    /// The app's actor classes, if it declares any.
    pub actors: Option<Arc<ActorHost>>,
    /// The app's classes exposed to clients directly.
    pub actor_routes: Vec<ActorRoute>,
}

/// One route of the table.
pub struct Route {
    pub pattern: RoutePattern,
    pub served: Arc<Served>,
}

/// Two apps (or one twice) routed at the same host pattern and prefix.
#[derive(Debug, thiserror::Error)]
#[error("route `{pattern}` is declared by both `{first}` and `{second}`")]
pub struct RouteOverlap {
    pub pattern: String,
    pub first: String,
    pub second: String,
}

/// Every route of the server, most specific first.
pub struct RouteTable {
    routes: Vec<Route>,
}

impl RouteTable {
    /// A table of `routes`; refused when two share a host pattern and a
    /// prefix.
    pub fn new(mut routes: Vec<Route>) -> Result<RouteTable, RouteOverlap> {
        // Most specific first: the first route that matches is the answer.
        routes.sort_by(|a, b| {
            (b.pattern.host.rank(), b.pattern.prefix.len())
                .cmp(&(a.pattern.host.rank(), a.pattern.prefix.len()))
                .then_with(|| a.pattern.cmp(&b.pattern))
        });
        for pair in routes.windows(2) {
            if pair[0].pattern == pair[1].pattern {
                return Err(RouteOverlap {
                    pattern: pair[0].pattern.to_string(),
                    first: pair[0].served.name.to_string(),
                    second: pair[1].served.name.to_string(),
                });
            }
        }
        Ok(RouteTable { routes })
    }

    /// The app serving `host` (as the request names it, maybe with a port)
    /// and `path`.
    pub fn find(&self, host: Option<&str>, path: &str) -> Option<&Arc<Served>> {
        // Normalized only when a route names a host: a table of bare paths
        // (every single-app server) never looks at it.
        let mut normal: Option<Option<String>> = None;
        self.routes
            .iter()
            .find(|route| {
                let host_ok = match &route.pattern.host {
                    HostMatch::Any => true,
                    pattern => normal
                        .get_or_insert_with(|| host.map(normal_host))
                        .as_deref()
                        .is_some_and(|host| pattern.matches(host)),
                };
                host_ok && route.pattern.covers(path)
            })
            .map(|route| &route.served)
    }

    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// Each app of the table once, in name order.
    pub fn apps(&self) -> Vec<Arc<Served>> {
        let mut apps: Vec<Arc<Served>> = Vec::new();
        for route in &self.routes {
            if !apps.iter().any(|a| Arc::ptr_eq(a, &route.served)) {
                apps.push(route.served.clone());
            }
        }
        apps.sort_by(|a, b| a.name.cmp(&b.name));
        apps
    }
}

/// `Host: Example.COM:8080` → `example.com`.
fn normal_host(host: &str) -> String {
    let host = match host.rsplit_once(':') {
        // An IPv6 literal (`[::1]:80`) keeps its brackets; a port goes.
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// The server's route table, read by every request and replaced whole by
/// a deploy.
pub struct Router {
    table: ArcSwap<RouteTable>,
}

impl Router {
    pub fn new(table: RouteTable) -> Arc<Router> {
        Arc::new(Router {
            table: ArcSwap::from_pointee(table),
        })
    }

    /// A router with one app on every host and path.
    pub fn single(served: Served) -> Arc<Router> {
        let table = RouteTable::new(vec![Route {
            pattern: RoutePattern::root(),
            served: Arc::new(served),
        }])
        .expect("one route cannot overlap");
        Router::new(table)
    }

    /// The app serving this request, if any.
    pub fn route<B>(&self, req: &http::Request<B>) -> Option<Arc<Served>> {
        let host = req
            .uri()
            .host()
            .or_else(|| req.headers().get(http::header::HOST)?.to_str().ok());
        self.table.load().find(host, req.uri().path()).cloned()
    }

    /// The table now.
    pub fn table(&self) -> Arc<RouteTable> {
        self.table.load_full()
    }

    /// Replaces the table: requests routed from now on see `table`.
    pub fn install(&self, table: RouteTable) {
        self.table.store(Arc::new(table));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(text: &str) -> RoutePattern {
        text.parse().unwrap()
    }

    #[test]
    fn patterns_parse_into_host_and_prefix() {
        assert_eq!(pattern("/"), RoutePattern::root());
        assert_eq!(pattern("/api/").prefix, "/api");
        assert_eq!(
            pattern("Example.com"),
            RoutePattern {
                host: HostMatch::Exact("example.com".into()),
                prefix: "/".into()
            }
        );
        assert_eq!(
            pattern("*.example.com/api").host,
            HostMatch::Suffix(".example.com".into())
        );
        assert_eq!(
            pattern("*.example.com/api").to_string(),
            "*.example.com/api"
        );
        for bad in [
            "/a?b",
            "/a*",
            "//x",
            "*/x",
            "*.*.com/",
            "a:80/",
            "a..b/",
            "ex ample/",
        ] {
            assert!(bad.parse::<RoutePattern>().is_err(), "{bad}");
        }
    }

    #[test]
    fn prefixes_match_whole_segments() {
        let api = pattern("/api");
        assert!(api.covers("/api"));
        assert!(api.covers("/api/x"));
        assert!(!api.covers("/apix"));
        assert!(!api.covers("/"));
        assert!(pattern("/").covers("/anything"));
    }

    #[test]
    fn no_routing_code_is_another_layers_and_the_readme_lists_each() {
        let readme = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"),
        )
        .unwrap();
        for code in RoutingErrorCode::ALL {
            let taken = weir_runtime::ErrorCode::ALL
                .iter()
                .map(|c| c.as_str())
                .chain(
                    crate::websocket::SocketErrorCode::ALL
                        .iter()
                        .map(|c| c.as_str()),
                );
            assert!(taken.into_iter().all(|t| t != code.as_str()));
            let row = format!("| {} | `{}` |", code.status(), code.as_str());
            assert!(readme.contains(&row), "README lacks the row `{row}`");
        }
    }

    #[test]
    fn hosts_are_compared_without_port_or_case() {
        assert_eq!(normal_host("Example.COM:8080"), "example.com");
        assert_eq!(normal_host("example.com."), "example.com");
        assert_eq!(normal_host("[::1]:80"), "[::1]");
        let wild = HostMatch::Suffix(".example.com".into());
        assert!(wild.matches("a.example.com"));
        assert!(wild.matches("a.b.example.com"));
        assert!(!wild.matches("example.com"));
        assert!(!wild.matches("badexample.com"));
    }
}
