use super::*;
use std::collections::HashMap;

fn refused(body: &str) -> Refusal {
    read(body.as_bytes()).expect_err(body)
}

fn malformed(body: &str) -> &'static str {
    match refused(body) {
        Refusal::Malformed(why) => why,
        other => panic!("{body}: {other:?}"),
    }
}

fn repeated(body: &str) -> (&'static str, String) {
    match refused(body) {
        Refusal::Repeated { place, name } => (place, name),
        other => panic!("{body}: {other:?}"),
    }
}

fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

#[test]
fn a_request_is_read_once_with_what_the_gateway_needs() {
    let body = r#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"echo",
        "arguments":{"x":[1,{"y":2}]},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
    let msg = read(body.as_bytes()).unwrap();
    assert_eq!(msg.shape, Shape::Object);
    let item = msg.single().unwrap();
    assert_eq!(item.jsonrpc.as_deref(), Some("2.0"));
    assert_eq!(item.id, Id::Usable(Value::from("a")));
    assert_eq!(item.method.as_deref(), Some("tools/call"));
    assert_eq!(item.called(), Some("echo"));
    assert_eq!(item.meta_version.as_deref(), Some("2026-07-28"));
    assert_eq!(item.params, Params::Object);
    assert!(item.is_request() && !item.answer);
    assert!(matches!(item.method, Some(Cow::Borrowed(_))), "no escapes: borrowed from the body");
}

#[test]
fn escapes_are_read_as_every_parser_reads_them() {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"n\u0061me":"del\u0065te_user"}}"#;
    assert_eq!(read(body.as_bytes()).unwrap().single().unwrap().called(), Some("delete_user"));
    // A name spelt two ways is still one name.
    let twice = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","n\u0061me":"x"}}"#;
    assert_eq!(repeated(twice), ("params", "name".to_string()));
    // A surrogate pair is a character, not a lone surrogate.
    assert!(read(r#"{"a":"\ud83d\ude00"}"#.as_bytes()).is_ok());
}

#[test]
fn the_target_of_each_call_method() {
    let target = |body: &str| read(body.as_bytes()).unwrap().items[0].called().map(str::to_string);
    assert_eq!(
        target(
            r#"{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///a","name":"x"}}"#
        ),
        Some("file:///a".into())
    );
    assert_eq!(
        target(r#"{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"p","uri":"u"}}"#),
        Some("p".into())
    );
    assert_eq!(target(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":5}}"#), None);
    assert_eq!(target(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":[]}"#), None);
    // A `name` elsewhere than in params is not the call's.
    assert_eq!(
        target(r#"{"jsonrpc":"2.0","id":1,"name":"a","method":"tools/call","params":{"x":{"name":"b"}}}"#),
        None
    );
}

#[test]
fn out_of_range_numbers_are_refused_anywhere_in_the_body() {
    for body in [
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{"pad":1e400}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"},"pad":-1e400}"#,
        r#"{"deep":[[[{"x":1E+309}]]]}"#,
    ] {
        assert_eq!(malformed(body), "a number outside the range of a double", "{body}");
    }
    let long = format!(r#"{{"pad":1{}}}"#, "0".repeat(400));
    assert_eq!(malformed(&long), "a number outside the range of a double", "400 digits in full");
    // Within range: accepted, and big integers keep their text in the body.
    assert!(read(
        br#"{"a":1e308,"b":-1.5e-400,"c":18446744073709551615,"d":123456789012345678901234567890}"#
    )
    .is_ok());
}

#[test]
fn lone_surrogates_are_refused_in_strings_and_names() {
    for body in [
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{"s":"\ud800"}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"},"x":"\udc00"}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{"\ud800":1}}}"#,
        r#"{"x":{"y":["\ud800\u0041"]}}"#,
        r#"["\ud800"]"#,
    ] {
        assert_eq!(malformed(body), "a lone surrogate or a bad \\u escape in a string", "{body}");
    }
}

#[test]
fn invalid_utf8_and_garbage_are_refused() {
    assert_eq!(read(b"{\"a\":\"\xff\"}").unwrap_err(), Refusal::Malformed("invalid UTF-8"));
    assert_eq!(malformed("{"), "the body ends before its JSON does");
    assert_eq!(malformed(""), "the body ends before its JSON does");
    assert_eq!(malformed("{} x"), "the body is not valid JSON");
    assert_eq!(malformed("{'a':1}"), "the body is not valid JSON");
    assert_eq!(malformed("{\"a\":\"\u{1}\"}"), "a control character in a string");
}

#[test]
fn nesting_is_capped() {
    assert!(read(nested(MAX_DEPTH).as_bytes()).is_ok());
    assert_eq!(malformed(&nested(MAX_DEPTH + 1)), "arrays and objects nested more than 127 deep");
    assert_eq!(malformed(&nested(200)), "arrays and objects nested more than 127 deep");
    let deep_args = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"a","arguments":{{"x":{}}}}}}}"#,
        nested(200)
    );
    assert_eq!(malformed(&deep_args), "arrays and objects nested more than 127 deep");
    // Whatever the strict reader takes, serde_json's tree reader takes too.
    let deepest = nested(MAX_DEPTH);
    assert!(serde_json::from_str::<Value>(&deepest).is_ok());
}

#[test]
fn repeated_names_are_refused_where_the_gateway_reads() {
    let cases = [
        (r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call"}"#, "the message", "method"),
        (r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#, "the message", "id"),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","name":"b"}}"#,
            "params",
            "name",
        ),
        (r#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"_meta":{"k":1,"k":2}}}"#, "params._meta", "k"),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"arguments":{"a":1,"b":2,"a":3}}}"#,
            "params.arguments",
            "a",
        ),
        (r#"[{"jsonrpc":"2.0","id":1,"method":"a"},{"id":1,"id":1}]"#, "the message", "id"),
        (r#"[{"params":{"name":"a","name":"b"}}]"#, "params", "name"),
    ];
    for (body, place, name) in cases {
        assert_eq!(repeated(body), (place, name.to_string()), "{body}");
    }
    // Deeper objects are the upstream's business; they are only checked as JSON.
    let deeper = r#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"arguments":{"a":{"b":1,"b":2}}}}"#;
    assert!(read(deeper.as_bytes()).is_ok());
    // Many names: the set takes over from the list, and still finds the repeat.
    let many: Vec<String> = (0..100).map(|i| format!("\"k{i}\":{i}")).collect();
    let body = format!(r#"{{"params":{{"arguments":{{{},"k7":0}}}}}}"#, many.join(","));
    assert_eq!(repeated(&body), ("params.arguments", "k7".to_string()));
    // A long name is echoed cut short.
    let long = "n".repeat(1000);
    let body = format!(r#"{{"{long}":1,"{long}":2}}"#);
    assert_eq!(repeated(&body).1.len(), NAME_ECHO);
}

#[test]
fn batches_have_one_item_per_element() {
    let body = r#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"}},
        {"jsonrpc":"2.0","method":"notifications/x"}, 5,
        {"jsonrpc":"2.0","id":7,"result":{}},
        {"jsonrpc":"2.0","id":3,"method":"ping","params":{"name":"zz"}}]"#;
    let msg = read(body.as_bytes()).unwrap();
    assert_eq!(msg.shape, Shape::Batch);
    assert!(msg.single().is_none());
    let summary: Vec<_> =
        msg.items.iter().map(|i| (i.object, i.method.as_deref(), i.is_request(), i.answer)).collect();
    assert_eq!(
        summary,
        [
            (true, Some("tools/call"), true, false),
            (true, Some("notifications/x"), false, false),
            (false, None, false, false),
            (true, None, false, true),
            (true, Some("ping"), true, false),
        ]
    );
    assert_eq!(msg.items[0].called(), Some("a"));
    assert_eq!(msg.items[4].name.as_deref(), Some("zz"), "each item's params are its own");
    assert_eq!(read(b"[]").unwrap().shape, Shape::Batch);
}

#[test]
fn other_json_is_read_and_left_to_the_caller() {
    for body in ["5", "\"x\"", "null", "true"] {
        let msg = read(body.as_bytes()).unwrap();
        assert_eq!((msg.shape, msg.items.len()), (Shape::Other, 0), "{body}");
    }
    let odd = read(br#"{"jsonrpc":2,"id":{"a":1},"method":3,"params":"p"}"#).unwrap();
    let item = odd.single().unwrap();
    assert_eq!((item.jsonrpc.as_deref(), item.id.clone(), item.method.as_deref()), (None, Id::Other, None));
    assert!(item.has_method);
    assert_eq!(item.params, Params::Other);
    assert_eq!(read(br#"{"id":null}"#).unwrap().items[0].id, Id::Null);
}

#[test]
fn what_it_accepts_every_reader_reads_the_same() {
    // The property the strict reader exists for: an accepted body parses in
    // serde_json to a tree whose call target is the one the walk found.
    let bodies = [
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"a":{"a":1,"a":2}}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///\u00e9"}}"#,
        r#"{"jsonrpc":"2.0","id":9007199254740993,"method":"prompts/get","params":{"name":"p"}}"#,
    ];
    for body in bodies {
        let item = read(body.as_bytes()).unwrap().items.remove(0);
        let tree: Value = serde_json::from_str(body).unwrap();
        let key = if item.method.as_deref() == Some("resources/read") { "uri" } else { "name" };
        assert_eq!(item.called(), tree["params"][key].as_str(), "{body}");
        assert_eq!(item.method.as_deref(), tree["method"].as_str());
        assert_eq!(Id::Usable(tree["id"].clone()), item.id);
    }
}

#[test]
fn the_tree_of_params_is_built_in_the_same_walk() {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo",
        "arguments":{"x":[1,-2,3.5,{"y":null,"z":true}],"s":"a\u00e9\n"},"_meta":{"k":{"deep":[[]]}}}}"#;
    let built = read_tree(body.as_bytes()).unwrap();
    let item = built.single().unwrap();
    let parsed: Value = serde_json::from_str(body).unwrap();
    assert_eq!(item.tree.as_ref().map(|t| Value::Object(t.clone())), Some(parsed["params"].clone()));
    assert_eq!(item.called(), Some("echo"), "what the gateway reads is read too");
    assert!(read(body.as_bytes()).unwrap().items[0].tree.is_none(), "no tree unless asked");
    // The rules hold as they do without a tree.
    let twice = r#"{"params":{"arguments":{"a":1,"a":2}}}"#;
    assert!(matches!(read_tree(twice.as_bytes()), Err(Refusal::Repeated { .. })));
    let not_object = read_tree(br#"{"params":[1]}"#).unwrap();
    assert_eq!((not_object.items[0].params, not_object.items[0].tree.is_none()), (Params::Other, true));
}

/// serde_json's reading of a body, with its refusal in this module's words:
/// what the walk must agree with wherever the gateway's own rules (repeated
/// names, the depth cap) do not apply.
fn serde_reading(body: &[u8]) -> Result<Value, &'static str> {
    serde_json::from_slice::<Value>(body).map_err(|e| {
        let text = e.to_string();
        if text.starts_with("number out of range") {
            "a number outside the range of a double"
        } else if text.contains("surrogate") || text.contains("hex escape") {
            "a lone surrogate or a bad \\u escape in a string"
        } else if text.starts_with("invalid unicode code point") {
            "invalid UTF-8"
        } else if text.starts_with("recursion limit exceeded") {
            "arrays and objects nested more than 127 deep"
        } else if text.contains("control character") {
            "a control character in a string"
        } else if e.is_eof() {
            "the body ends before its JSON does"
        } else {
            "the body is not valid JSON"
        }
    })
}

/// Compares the walk with serde_json on one body.
fn agrees_with_serde(body: &[u8]) {
    let shown = String::from_utf8_lossy(body);
    let theirs = serde_reading(body);
    match (read_tree(body), theirs) {
        (Err(Refusal::Repeated { .. } | Refusal::OtherCase { .. }), _) => {}
        (Err(Refusal::Malformed(ours)), Err(theirs)) => assert_eq!(ours, theirs, "{shown}"),
        (Err(ours), Ok(_)) => panic!("refused what serde_json reads ({ours:?}): {shown}"),
        (Ok(_), Err(theirs)) => panic!("read what serde_json refuses ({theirs}): {shown}"),
        (Ok(msg), Ok(tree)) => {
            let Some(item) = msg.single() else { return };
            let str_of = |v: &Value| v.as_str().map(str::to_string);
            assert_eq!(
                item.method.as_deref().map(str::to_string),
                tree.get("method").and_then(str_of),
                "{shown}"
            );
            assert_eq!(item.jsonrpc.as_deref().map(str::to_string), tree.get("jsonrpc").and_then(str_of));
            let params = tree.get("params");
            let name = params.and_then(|p| p.get("name")).and_then(str_of);
            assert_eq!(item.name.as_deref().map(str::to_string), name, "{shown}");
            let built = item.tree.clone().map(Value::Object);
            assert_eq!(built.as_ref(), params.filter(|p| p.is_object()), "{shown}");
            match (&item.id, tree.get("id")) {
                (Id::Usable(ours), Some(theirs)) => assert_eq!(ours, theirs, "{shown}"),
                (Id::Null, Some(Value::Null)) | (Id::Absent, None) => {}
                (Id::Other, Some(theirs)) => {
                    assert!(theirs.is_object() || theirs.is_array() || theirs.is_boolean())
                }
                (ours, theirs) => panic!("id {ours:?} against {theirs:?}: {shown}"),
            }
        }
    }
}

#[test]
fn it_reads_and_refuses_as_serde_json_does() {
    let seeds: [&[u8]; 6] = [
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi","n":[1,-2.5e3,0,true,null]},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#,
        br#"{"jsonrpc":"2.0","id":"x\u00e9\n","method":"resources/read","params":{"uri":"file:///\ud83d\ude00","x":{"a":1,"a":2}}}"#,
        br#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"id":2,"result":{}}, 5, [1]]"#,
        b" { \"a\" : [ 1 , 2.0 , -0 , 1E+2 , \"\\\"\\\\\\/\\b\\f\\n\\r\\t\" ] } ",
        br#"{"id":-12345678901234567890,"params":{"big":123456789012345678901234567890,"f":1.5e-400}}"#,
        b"\"caf\xc3\xa9\"",
    ];
    let snippets: [&[u8]; 22] = [
        b"\\ud800",
        b"\\udc00",
        b"\\ud83d\\ude00",
        b"\\u00e9",
        b"\\u12g4",
        b"\\x",
        b"1e400",
        b"-0",
        b"01",
        b"1.",
        b"1e",
        b"-",
        b"\"name\"",
        b"\"params\"",
        b",",
        b":",
        b"{",
        b"]",
        b"\xff",
        b"\xc3",
        b"\x01",
        b"tru",
    ];
    let alphabet = b"{}[],:\"\\ud80ceE+-.019trnlasfx \n\t";
    // A fixed xorshift: the same bodies on every run.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |bound: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % bound as u64) as usize
    };
    for seed in seeds {
        agrees_with_serde(seed);
        for _ in 0..4000 {
            let mut body = seed.to_vec();
            for _ in 0..1 + next(3) {
                let at = next(body.len() + 1);
                match next(5) {
                    0 if at < body.len() => body[at] = alphabet[next(alphabet.len())],
                    1 if at < body.len() => {
                        body.remove(at);
                    }
                    2 => body.truncate(at),
                    _ => {
                        let snippet = snippets[next(snippets.len())];
                        body.splice(at..at, snippet.iter().copied());
                    }
                }
            }
            agrees_with_serde(&body);
        }
    }
}

/// Each body, read with and without a `params` tree, is refused for the
/// name repeated at the place given.
fn assert_repeated(cases: &[(&[u8], &'static str, &str)]) {
    for &(body, place, name) in cases {
        for r in [read(body), read_tree(body)] {
            assert_eq!(
                r.unwrap_err(),
                Refusal::Repeated { place, name: name.to_string() },
                "{}",
                body.escape_ascii()
            );
        }
    }
}

#[test]
fn names_spelt_with_escapes_are_one_name_everywhere_the_gateway_reads() {
    let cases: [(&[u8], &str, &str); 7] = [
        (br#"{"method":"tools/list","\u006dethod":"tools/call"}"#, "the message", "method"),
        // (`METHOD` in the message itself is refused as such: see below.)
        (br#"{"params":{"NAME":"x","name":"a","n\u0061me":"b"}}"#, "params", "name"),
        (br#"{"params":{"name":"a","\u006E\u0061\u006d\u0065":"b"}}"#, "params", "name"),
        (br#"{"params":{"_meta":{},"\u005fmeta":{}}}"#, "params", "_meta"),
        (br#"{"params":{"arguments":{"a/b":1,"a\/b":2}}}"#, "params.arguments", "a/b"),
        (br#"{"params":{"arguments":{"\ud83d\ude00":1,"\uD83D\uDE00":2}}}"#, "params.arguments", "\u{1f600}"),
        (b"{\"params\":{\"_meta\":{\"\xc3\xa9\":1,\"\\u00e9\":2}}}", "params._meta", "\u{e9}"),
    ];
    assert_repeated(&cases);
    // Near twins are different names, in serde_json as here.
    assert!(read(br#"{"method":"a","method\u0000":"b","method ":"c"}"#).is_ok());
}

#[test]
fn grammar_edges_agree_with_serde_json() {
    let bodies: [&[u8]; 44] = [
        b"",
        b" ",
        b"\xef\xbb\xbf{}",
        b"{}\x00",
        b"{}\x0b",
        b"{}\x0c",
        b"\x0c{}",
        b"{}\xc2\xa0",
        b"-",
        b"-0",
        b"01",
        b"-01",
        b"1.",
        b".5",
        b"1e",
        b"1e+",
        b"+1",
        b"1E400",
        b"1e-400",
        b"-1e-400",
        b"1.7976931348623158e308",
        b"1.7976931348623159e308",
        b"0e999999999999999999999",
        b"1e999999999999999999999",
        b"\"\\/\"",
        b"\"\\uABCD\\uabcd\"",
        b"\"\\uDE00\\uD83D\"",
        b"\"\\ud800\\n\"",
        b"\"\\ud800\\ud800\"",
        b"\"\\u0000\"",
        b"\"\x7f\"",
        b"\"\x1f\"",
        b"\"\xed\xa0\x80\"",
        b"\"\xc0\xaf\"",
        b"\"\xe2\x82\"",
        b"\"\xf4\x90\x80\x80\"",
        b"\"\\ud800\\u",
        b"[1,]",
        b"[,1]",
        b"{\"a\":1,}",
        b"nulll",
        b"[true false]",
        b"Infinity",
        b"NaN",
    ];
    for body in bodies {
        agrees_with_serde(body);
        let _ = read(body);
    }
    // Every special byte at every offset of short strings: the eight-at-a-time
    // scan at chunk and buffer ends.
    for len in 0..24 {
        for at in 0..=len {
            for special in
                [&b"\""[..], b"\\n", b"\\u00e9", b"\x00", b"\x1f", b"\x7f", b"\x80", b"\xff", b"\xc3\xa9"]
            {
                let mut s = b"\"".to_vec();
                s.extend(std::iter::repeat_n(b'a', at));
                s.extend_from_slice(special);
                s.extend(std::iter::repeat_n(b'b', len - at));
                agrees_with_serde(&s);
                s.push(b'"');
                agrees_with_serde(&s);
                agrees_with_serde(&[&b"{\"method\":"[..], &s, b"}"].concat());
            }
        }
    }
    // Arrays and objects mixed, around the cap.
    for depth in MAX_DEPTH - 1..=MAX_DEPTH + 1 {
        let open: String = (0..depth).map(|i| if i % 2 == 0 { "{\"a\":" } else { "[" }).collect();
        let close: String = (0..depth).rev().map(|i| if i % 2 == 0 { "}" } else { "]" }).collect();
        agrees_with_serde(format!("{open}1{close}").as_bytes());
    }
}

#[test]
fn names_that_differ_only_in_case_are_one_name_where_the_gateway_reads() {
    // A decoder that matches names case-insensitively (Go's encoding/json,
    // the last match winning) would read the second of each pair.
    let cases: [(&[u8], &str, &str); 6] = [
        (br#"{"jsonrpc":"2.0","id":1,"method":"ping","Method":"tools/call"}"#, "the message", "Method"),
        (br#"{"method":"tools/call","params":{"name":"echo","Name":"delete_user"}}"#, "params", "Name"),
        (br#"{"method":"tools/call","params":{"name":"echo","NAME":"delete_user"}}"#, "params", "NAME"),
        ("{\"params\":{\"_meta\":{},\"_META\":{}}}".as_bytes(), "params", "_META"),
        ("{\"params\":{\"arguments\":{\"path\":1,\"PATH\":2}}}".as_bytes(), "params.arguments", "PATH"),
        // `ſ` folds to `s`, the Kelvin sign to `k`.
        ("{\"params\":{\"name\":\"x\"},\"paramſ\":{\"name\":\"y\"}}".as_bytes(), "the message", "paramſ"),
    ];
    assert_repeated(&cases);
    let kelvin = "{\"params\":{\"arguments\":{\"k\":1,\"\u{212a}\":2}}}";
    assert!(matches!(read(kelvin.as_bytes()), Err(Refusal::Repeated { .. })));
    // Names the gateway does not read are not judged: a tool's result, say.
    assert!(read(br#"{"jsonrpc":"2.0","id":1,"result":{"Name":1,"name":2}}"#).is_ok());
    // One spelling alone is fine.
    assert!(read(br#"{"method":"tools/call","params":{"Name":"x","arguments":{"Path":1}}}"#).is_ok());
}

/// Unicode simple case folding, as a case-insensitive decoder matches
/// names (Go's `encoding/json` and `bytes.EqualFold`): here the
/// one-character upper then lower mappings; the Turkish dotted and dotless
/// i fold only to themselves there.
fn simple_fold(c: char) -> char {
    fn single(mut it: impl Iterator<Item = char>, or: char) -> char {
        match (it.next(), it.next()) {
            (Some(x), None) => x,
            _ => or,
        }
    }
    if matches!(c, 'İ' | 'ı') {
        return c;
    }
    let upper = single(c.to_uppercase(), c);
    single(upper.to_lowercase(), upper)
}

#[test]
fn every_letter_a_case_insensitive_decoder_matches_with_another_folds_to_one_name() {
    // Found writing the oracle of the strict_body fuzz target: `µ` and `μ`,
    // U+0345 and `ι`, and the Cyrillic letter variants U+1C80..U+1C88 and
    // their plain letters are one name to such a decoder, and were two here.
    let mut classes: HashMap<char, Vec<char>> = HashMap::new();
    for c in (0..=0x1_FFFF).filter_map(char::from_u32) {
        classes.entry(simple_fold(c)).or_default().push(c);
    }
    for class in classes.values().filter(|class| class.len() > 1) {
        let one = |c: char| folded(&Cow::Owned(c.to_string())).into_owned();
        assert!(class.iter().all(|&c| one(c) == one(class[0])), "{class:?} fold to more than one name");
    }
    let cases: [(&[u8], &str, &str); 3] = [
        (
            "{\"params\":{\"arguments\":{\"\u{3bc}\":1,\"\u{b5}\":2}}}".as_bytes(),
            "params.arguments",
            "\u{b5}",
        ),
        (
            "{\"params\":{\"arguments\":{\"\u{3b9}\":1,\"\u{345}\":2}}}".as_bytes(),
            "params.arguments",
            "\u{345}",
        ),
        (
            "{\"params\":{\"arguments\":{\"\u{432}\":1,\"\u{1c80}\":2}}}".as_bytes(),
            "params.arguments",
            "\u{1c80}",
        ),
    ];
    assert_repeated(&cases);
}

#[test]
fn a_message_member_named_as_a_json_rpc_member_in_another_case_is_refused() {
    // Found by the strict_body fuzz target: `{"method":"tools/call",…,"iD":12}`
    // was a notification here and is a request to a decoder that matches
    // names case-insensitively. Worse, an answer (no `method`) with a
    // `Method` was relayed as an answer, unchecked by the rules, and such a
    // decoder runs it as a call.
    let answer =
        r#"{"jsonrpc":"2.0","id":1,"result":{},"Method":"tools/call","params":{"name":"delete_user"}}"#;
    let other = |body: &str| match refused(body) {
        Refusal::OtherCase { name } => name,
        r => panic!("{body}: {r:?}"),
    };
    assert_eq!(other(answer), "Method");
    assert_eq!(refused(answer).error().reason(), "invalid_request");
    assert_eq!(other(r#"{"jsonrpc":"2.0","id":1,"result":{},"METHOD":"x"}"#), "METHOD");
    assert_eq!(other(r#"{"JSONRPC":"2.0","id":1,"method":"ping"}"#), "JSONRPC");
    let found = r#"{"method":"tools/call","params":{"name":"sample","arguments":{"prompt":"greet"}},"jsonrpc":"2.0","iD":12}"#;
    assert_eq!(other(found), "iD");
    assert_eq!(other(r#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","Id":2}]"#), "Id");
    assert_eq!(other("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"paramſ\":{}}"), "paramſ");
    // Only the message's own members: anywhere else a name is the tool's.
    assert!(read(br#"{"jsonrpc":"2.0","id":1,"result":{"Method":1}}"#).is_ok());
    assert!(
        read(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","Params":{}}}"#).is_ok()
    );
}
