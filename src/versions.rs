//! Every MCP protocol revision the gateway knows, in one table: the one it
//! speaks to 2026 clients, the session-era ones it speaks to legacy clients
//! and servers, and an older one it only names in metrics.

/// MCP 2026-07-28: stateless, what the front door speaks.
pub const MODERN: &str = "2026-07-28";

/// The revisions a 2026 client may request, newest first.
pub const SUPPORTED: &[&str] = &[MODERN];

/// The session-era revisions (`initialize`, `Mcp-Session-Id`), newest
/// first: what the gateway offers a legacy upstream by default is the first.
pub const LEGACY: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26"];

/// Older than any the gateway serves: named in metrics, never negotiated.
const OLDER: &[&str] = &["2024-11-05"];

/// A requested revision as a bounded metrics label: itself when known,
/// `other` when not, `none` when none was asked for.
pub fn label(requested: Option<&str>) -> &'static str {
    let Some(requested) = requested else {
        return "none";
    };
    SUPPORTED.iter().chain(LEGACY).chain(OLDER).find(|v| **v == requested).copied().unwrap_or("other")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_revision_labels_itself() {
        for v in ["2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"] {
            assert_eq!(label(Some(v)), v);
        }
        assert_eq!(label(Some("2099-01-01")), "other");
        assert_eq!(label(None), "none");
        assert!(!LEGACY.contains(&MODERN));
    }
}
