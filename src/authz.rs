//! Who may call what (issue 13): allow and deny rules per route, by tool,
//! prompt and resource-URI pattern, for principals, key groups or JWT
//! scopes. The first rule that matches both the item and the caller
//! decides; no match allows. A denied item is refused on call (403) and is
//! absent from the lists every cell passes on (tools, prompts, resources,
//! resource templates).

use std::sync::Arc;

use serde_json::{Map, Value};

/// What a rule names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Tool,
    Prompt,
    Resource,
}

/// One `[[routes.rules]]` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rule {
    pub allow: bool,
    pub tools: Vec<String>,
    pub prompts: Vec<String>,
    pub resources: Vec<String>,
    /// Whom it applies to: any of these (all empty: everyone).
    pub principals: Vec<String>,
    pub groups: Vec<String>,
    pub scopes: Vec<String>,
}

impl Rule {
    fn names(&self, kind: Kind, name: &str) -> bool {
        let patterns = match kind {
            Kind::Tool => &self.tools,
            Kind::Prompt => &self.prompts,
            Kind::Resource => &self.resources,
        };
        patterns.iter().any(|p| glob(p, name))
    }

    fn covers(&self, who: &Who) -> bool {
        let everyone = self.principals.is_empty() && self.groups.is_empty() && self.scopes.is_empty();
        everyone
            || self.principals.contains(&who.principal)
            || self.groups.iter().any(|g| who.groups.contains(g))
            || self.scopes.iter().any(|s| who.scopes.contains(s))
    }
}

/// `*` matches any run of characters (none included); everything else itself.
pub fn glob(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// Who is asking, as the rules see it.
#[derive(Debug, Clone, Default)]
pub struct Who {
    pub principal: String,
    pub groups: Vec<String>,
    pub scopes: Vec<String>,
}

/// A route's rules seen by one caller.
#[derive(Debug, Clone)]
pub struct View {
    rules: Arc<[Rule]>,
    who: Who,
}

impl View {
    pub fn new(rules: Arc<[Rule]>, who: Who) -> View {
        View { rules, who }
    }

    pub fn allows(&self, kind: Kind, name: &str) -> bool {
        self.rules.iter().find(|r| r.names(kind, name) && r.covers(&self.who)).is_none_or(|r| r.allow)
    }

    /// Whether a call of `method` on `name` (tool, prompt or URI) may go on.
    pub fn allows_call(&self, method: &str, name: &str) -> bool {
        match kind_of_call(method) {
            Some(kind) => self.allows(kind, name),
            None => true,
        }
    }

    /// Removes the denied items of a list result (`method` says which);
    /// whether anything was removed.
    pub fn filter(&self, method: &str, result: &mut Map<String, Value>) -> bool {
        let Some((key, kind, field)) = list_of(method) else {
            return false;
        };
        let Some(Value::Array(items)) = result.get_mut(key) else {
            return false;
        };
        let before = items.len();
        items.retain(|item| {
            item.get(field).and_then(Value::as_str).is_none_or(|name| self.allows(kind, name))
        });
        items.len() != before
    }

    /// A whole JSON-RPC answer to a list `method` with its denied items
    /// removed: `Ok(None)` when nothing changes, `Err` when it is not JSON
    /// (the contract of a relay's rewrite, [`crate::bridge::relay::Rewrite`]).
    #[allow(clippy::result_unit_err)]
    pub fn filter_message(&self, method: &str, text: &str) -> Result<Option<String>, ()> {
        if list_of(method).is_none() {
            return Ok(None);
        }
        let mut msg: Value = serde_json::from_str(text).map_err(|_| ())?;
        let changed = match msg.get_mut("result") {
            Some(Value::Object(result)) => self.filter(method, result),
            _ => false,
        };
        Ok(changed.then(|| msg.to_string()))
    }
}

/// What a call method names.
pub fn kind_of_call(method: &str) -> Option<Kind> {
    match method {
        "tools/call" => Some(Kind::Tool),
        "prompts/get" => Some(Kind::Prompt),
        "resources/read" | "resources/subscribe" | "resources/unsubscribe" => Some(Kind::Resource),
        _ => None,
    }
}

/// A list method's array key, the kind of its items, and their name field.
fn list_of(method: &str) -> Option<(&'static str, Kind, &'static str)> {
    match method {
        "tools/list" => Some(("tools", Kind::Tool, "name")),
        "prompts/list" => Some(("prompts", Kind::Prompt, "name")),
        "resources/list" => Some(("resources", Kind::Resource, "uri")),
        "resources/templates/list" => Some(("resourceTemplates", Kind::Resource, "uriTemplate")),
        _ => None,
    }
}

/// What one legacy client's message calls.
#[derive(Debug, PartialEq, Eq)]
pub enum Target<'m> {
    /// Nothing a rule names.
    Nothing,
    /// A method and its tool or prompt name, or resource URI.
    Call(&'m str, &'m str),
    /// A call whose target cannot be read: no rule can clear it (refused).
    Unreadable,
}

/// What a legacy client's message (or one item of its batch) calls, from the
/// one strict read of its body: a body with a repeated member or a value
/// parsers read differently never got this far, so this is what the
/// upstream will run.
pub fn legacy_target<'m>(item: &'m crate::front::strict::Item<'_>) -> Target<'m> {
    let Some(method) = item.method.as_deref() else {
        return Target::Nothing;
    };
    if kind_of_call(method).is_none() {
        return Target::Nothing;
    }
    match item.called() {
        Some(name) => Target::Call(method, name),
        None => Target::Unreadable,
    }
}

/// The first call of a legacy client's message (each request of a batch
/// too) that `view` does not allow, in words: what the front door refuses
/// before any cell runs the message.
pub fn legacy_denied(view: &View, message: &crate::front::strict::Message<'_>) -> Option<String> {
    message.items.iter().find_map(|item| match legacy_target(item) {
        Target::Call(method, name) => (!view.allows_call(method, name)).then(|| format!("{method} {name}")),
        Target::Nothing => None,
        Target::Unreadable => Some("a call whose target cannot be read".to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn globs_match_runs_of_anything() {
        assert!(glob("delete_*", "delete_user"));
        assert!(glob("*", "anything"));
        assert!(glob("file:///secret/*", "file:///secret/a/b"));
        assert!(glob("a*b*c", "aXXbYYc"));
        assert!(!glob("a*b*c", "aXXbYY"));
        assert!(!glob("delete_*", "undelete_user"));
        assert!(glob("exact", "exact"));
        assert!(!glob("exact", "exactly"));
        assert!(!glob("ab*ba", "aba"), "the two ends do not overlap");
    }

    #[test]
    fn the_first_matching_rule_decides() {
        let rules: Arc<[Rule]> = vec![
            Rule {
                allow: true,
                tools: vec!["delete_*".into()],
                scopes: vec!["admin".into()],
                ..Default::default()
            },
            Rule { allow: false, tools: vec!["delete_*".into()], ..Default::default() },
            Rule {
                allow: false,
                resources: vec!["file:///secret/*".into()],
                groups: vec!["guests".into()],
                ..Default::default()
            },
        ]
        .into();
        let user = View::new(rules.clone(), Who { principal: "jwt:a".into(), ..Default::default() });
        let admin = View::new(rules.clone(), Who { scopes: vec!["admin".into()], ..Default::default() });
        let guest = View::new(rules, Who { groups: vec!["guests".into()], ..Default::default() });
        assert!(!user.allows_call("tools/call", "delete_user"));
        assert!(admin.allows_call("tools/call", "delete_user"));
        assert!(user.allows_call("tools/call", "echo"));
        assert!(!guest.allows_call("resources/read", "file:///secret/x"));
        assert!(user.allows_call("resources/read", "file:///secret/x"));
        let mut list = json!({"tools": [{"name": "echo"}, {"name": "delete_user"}], "nextCursor": "c"});
        assert!(user.filter("tools/list", list.as_object_mut().unwrap()));
        assert_eq!(list, json!({"tools": [{"name": "echo"}], "nextCursor": "c"}));
        let text = r#"{"jsonrpc":"2.0","id":1,"result":{"resourceTemplates":[{"uriTemplate":"file:///secret/{x}"}]}}"#;
        assert!(guest.filter_message("resources/templates/list", text).unwrap().unwrap().contains("[]"));
        assert_eq!(admin.filter_message("tools/list", text), Ok(None));
    }

    #[test]
    fn a_legacy_call_names_its_target() {
        use crate::front::strict;
        let check = |body: &[u8], want: Target<'_>| {
            let msg = strict::read(body).unwrap();
            assert_eq!(legacy_target(&msg.items[0]), want, "{}", String::from_utf8_lossy(body));
        };
        let call =
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{}}}"#;
        check(call, Target::Call("tools/call", "echo"));
        let read = br#"{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///a"}}"#;
        check(read, Target::Call("resources/read", "file:///a"));
        check(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#, Target::Nothing);
        // A call whose target cannot be read is refused, not let through.
        check(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":5}}"#, Target::Unreadable);
        let neighbour =
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"delete_user","uri":5}}"#;
        check(neighbour, Target::Call("tools/call", "delete_user"));
        // A repeated member never reaches this: the strict read refuses it.
        let twice = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","name":"delete_user"}}"#;
        assert!(strict::read(twice).is_err());
    }
}
