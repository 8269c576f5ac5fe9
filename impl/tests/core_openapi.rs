//! The machine-readable public API (`docs/core-api.openapi.yaml`) names exactly the
//! routes and methods Core's router serves: a route added without its OpenAPI entry, or
//! an entry for a route that does not exist, fails here. (The property-based check of
//! the answers against the document is `ci/api-check.sh`, run by `make check`.)

use std::collections::BTreeSet;
use std::path::Path;

/// `(METHOD, path)` with every `{param}` written `{}`.
type Operation = (String, String);

fn normalize(path: &str) -> String {
    let mut out = String::new();
    let mut in_param = false;
    for c in path.chars() {
        match c {
            '{' => {
                in_param = true;
                out.push_str("{}");
            }
            '}' => in_param = false,
            _ if in_param => {}
            _ => out.push(c),
        }
    }
    out
}

/// Every `.route("path", get(..).put(..))` call of a router source file.
fn routed(source: &str) -> BTreeSet<Operation> {
    let mut ops = BTreeSet::new();
    let mut rest = source;
    while let Some(at) = rest.find(".route(") {
        let call = &rest[at + ".route(".len()..];
        // The call's text up to its matching parenthesis.
        let mut depth = 1usize;
        let mut end = call.len();
        for (i, c) in call.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i;
                        break;
                    }
                }
                _ => {}
            }
        }
        let call = &call[..end];
        let Some(open) = call.find('"') else {
            rest = &rest[at + 1..];
            continue;
        };
        let close = open + 1 + call[open + 1..].find('"').expect("closed path literal");
        let path = &call[open + 1..close];
        if path.starts_with("/v1/") {
            for method in ["get", "post", "put", "patch", "delete"] {
                let token = format!("{method}(");
                let found = call.match_indices(&token).any(|(i, _)| {
                    i == 0
                        || !call[..i]
                            .chars()
                            .next_back()
                            .is_some_and(|c| c.is_alphanumeric() || c == '_')
                });
                if found {
                    ops.insert((method.to_uppercase(), normalize(path)));
                }
            }
        }
        rest = &rest[at + 1..];
    }
    ops
}

#[test]
fn openapi_document_names_every_public_route() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let gateway = root.join("src/core_runtime/gateway");
    let mut served = BTreeSet::new();
    for file in ["api.rs", "credentials.rs"] {
        let source = std::fs::read_to_string(gateway.join(file)).expect("router source");
        served.extend(routed(&source));
    }
    assert!(
        served.len() >= 20,
        "the route scan found too little: {served:?}"
    );

    let text = std::fs::read_to_string(root.join("../docs/core-api.openapi.yaml"))
        .expect("docs/core-api.openapi.yaml");
    let doc: serde_json::Value =
        serde_saphyr::from_str(&text).expect("the OpenAPI document is YAML");
    assert_eq!(doc["openapi"], "3.1.0");
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            if ["get", "post", "put", "patch", "delete"].contains(&method.as_str()) {
                documented.insert((method.to_uppercase(), normalize(path)));
                let op = &item[method];
                assert!(
                    op["operationId"].is_string(),
                    "{method} {path} has no operationId"
                );
                assert!(
                    op["responses"]["401"].is_object(),
                    "{method} {path} does not document the 401 of a missing API key"
                );
            }
        }
    }
    let undocumented: Vec<_> = served.difference(&documented).collect();
    let phantom: Vec<_> = documented.difference(&served).collect();
    assert!(
        undocumented.is_empty(),
        "routes missing from the OpenAPI document: {undocumented:?}"
    );
    assert!(
        phantom.is_empty(),
        "OpenAPI operations Core does not serve: {phantom:?}"
    );
}

#[test]
fn route_scan_reads_chained_methods() {
    let ops = routed(
        r#".route("/v1/a/{id}", get(read).put(write).layer(x(1)))
           .route("/v1/b", post(create))
           .route("/api/v1/other", get(skip))"#,
    );
    let want: BTreeSet<Operation> = [
        ("GET".to_string(), "/v1/a/{}".to_string()),
        ("PUT".to_string(), "/v1/a/{}".to_string()),
        ("POST".to_string(), "/v1/b".to_string()),
    ]
    .into_iter()
    .collect();
    assert_eq!(ops, want);
}
