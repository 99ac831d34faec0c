use serde_json::json;

use super::*;

#[test]
fn a_legacy_client_gets_no_code_of_the_reserved_range() {
    let needs = json!({"requiredCapabilities": {"sampling": {}}});
    let error = legacy_error(&json!({"code": -32021, "message": "needs sampling", "data": needs}));
    assert_eq!(error, json!({"code": -32600, "message": "needs sampling", "data": needs}));
    for code in [-32020, -32022, -32042, -32099, -32050] {
        let error = legacy_error(&json!({"code": code, "message": "m", "data": {"x": 1}}));
        assert_eq!(error["code"], -32603, "{code}");
        assert_eq!(error["data"], json!({"x": 1}), "data kept");
    }
    for code in [-32002, -32019, -32100, -32601, -32602, 7] {
        assert_eq!(legacy_error(&json!({"code": code, "message": "m"}))["code"], code, "{code}");
    }
}
