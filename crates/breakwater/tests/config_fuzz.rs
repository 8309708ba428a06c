//! The config loader on mutated TOML (proptest, `PROPTEST_CASES`, 256 in
//! the suite; a long run is
//! `PROPTEST_CASES=1000000 cargo test --release -p breakwater --test config_fuzz`):
//! it never panics, every refusal names a key or a line, and no refusal
//! echoes a secret.

use std::path::Path;

use breakwater::config::Config;
use proptest::prelude::*;

const SECRET: &str = "whsec_fuzzsecretvalue0123456789";
const TOKEN: &str = "admintokenvalue0123456789";

fn base() -> String {
    format!(
        r#"[ingress]
listen = "127.0.0.1:8080"
max_body_bytes = 1048576

[admin]
listen = "127.0.0.1:9090"
token = "{TOKEN}"

[queue]
path = "data/queue"
lease_ms = 30000

[sink]
url = "postgres://app:dbpassword0123@127.0.0.1/app"
lock_timeout_ms = 1000
statement_timeout_ms = 5000

[workers]
max_concurrency = 16

[breaker.half_open]
max_probes = 1

[[source]]
name = "stripe"
scheme = "stripe"
secrets = ["{SECRET}"]
entity_key = "json:/data/object/id"

[[source.statement]]
sql = "UPDATE orders SET status = $status WHERE id = $entity"
params = {{ status = "json:/data/object/status" }}
"#
    )
}

/// One edit of the text: bytes replaced, inserted or removed at a place.
#[derive(Debug, Clone)]
enum Edit {
    Replace(usize, String),
    Insert(usize, String),
    Remove(usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    let piece = prop_oneof![
        Just("=".to_owned()),
        Just("\"".to_owned()),
        Just("[".to_owned()),
        Just("]".to_owned()),
        Just("\n".to_owned()),
        Just("0".to_owned()),
        Just("-1".to_owned()),
        Just("x".to_owned()),
        Just("{".to_owned()),
        Just("[[source]]\n".to_owned()),
        ".{0,6}".prop_map(|s| s),
    ];
    prop_oneof![
        (any::<usize>(), piece.clone()).prop_map(|(at, s)| Edit::Replace(at, s)),
        (any::<usize>(), piece).prop_map(|(at, s)| Edit::Insert(at, s)),
        (any::<usize>(), 1usize..20).prop_map(|(at, n)| Edit::Remove(at, n)),
    ]
}

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut t = text.to_owned();
    for e in edits {
        let boundary = |at: usize, t: &str| {
            let mut at = at % (t.len() + 1);
            while !t.is_char_boundary(at) {
                at -= 1;
            }
            at
        };
        match e {
            Edit::Replace(at, s) => {
                let at = boundary(*at, &t);
                let end = boundary(at + s.len().max(1), &t).max(at);
                t.replace_range(at..end, s);
            }
            Edit::Insert(at, s) => {
                let at = boundary(*at, &t);
                t.insert_str(at, s);
            }
            Edit::Remove(at, n) => {
                let at = boundary(*at, &t);
                let end = boundary(at + n, &t).max(at);
                t.replace_range(at..end, "");
            }
        }
    }
    t
}

proptest! {
    #[test]
    fn mutated_configs_are_refused_clearly_and_never_echo_a_secret(
        edits in proptest::collection::vec(edit(), 1..4),
    ) {
        let text = apply(&base(), &edits);
        if let Err(e) = Config::from_toml_with_env(&text, Path::new("fuzz.toml"), Vec::new()) {
            let message = format!("{e:#}");
            // A parse error names its line; a refused value names its key
            // (`invalid config: <key> (line N): ...`).
            prop_assert!(
                message.contains("line ") || message.starts_with("invalid config: "),
                "names no key or line: {}", message
            );
            for secret in [SECRET, TOKEN, "dbpassword0123"] {
                prop_assert!(!message.contains(secret), "echoed a secret: {}", message);
            }
        }
    }
}

#[test]
fn the_unmutated_base_loads() {
    Config::from_toml_with_env(&base(), Path::new("fuzz.toml"), Vec::new()).expect("base config");
}
