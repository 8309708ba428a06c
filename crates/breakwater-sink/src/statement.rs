//! Configured statements: parsing `$name` parameters, translating them to
//! the database's positional placeholders, and extracting their values from
//! an event.
//!
//! Translation happens once, at [`crate::connect`], so a typo in a
//! statement (an unknown `$name`, a malformed `params` entry) stops the
//! service at startup instead of dead-lettering every webhook. The scanner
//! is deliberately small: it knows enough of SQL's lexical structure
//! (single-quoted and `E'...'` strings, quoted identifiers, comments,
//! dollar-quoted text, `$` inside identifiers) not to mistake any of those
//! for a parameter. Values are extracted per event into [`ParamValue`]s that
//! each backend then binds in its own way.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use crate::param::{ParamSource, ParamValue, header, parse_body};
use crate::version::VersionSpec;
use crate::{Event, SinkError, SinkSetupError, StatementSpec};

/// Which placeholder syntax to emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// `$1`, `$2`, ...
    Postgres,
    /// `?1`, `?2`, ...
    Sqlite,
}

/// One named parameter, in placeholder order (`$1` is `params[0]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Param {
    pub(crate) name: String,
    pub(crate) source: ParamSource,
}

/// A statement ready to prepare: positional SQL and its parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CompiledStatement {
    pub(crate) sql: String,
    pub(crate) params: Vec<Param>,
}

impl CompiledStatement {
    /// Extracts every parameter's value from `event`. `json` is the body
    /// parsed as JSON, or `None` if it is not JSON; `version` the event's
    /// version (`$version`).
    pub(crate) fn values(
        &self,
        event: &Event<'_>,
        json: Option<&Value>,
        version: Option<i64>,
    ) -> Result<Vec<ParamValue>, SinkError> {
        self.params
            .iter()
            .map(|p| extract(&p.name, &p.source, event, json, version))
            .collect()
    }
}

/// The statements of every source, compiled, and where each source's
/// events carry their version (sources without one are not named).
#[derive(Debug, Default)]
pub(crate) struct Compiled {
    statements: HashMap<String, Vec<CompiledStatement>>,
    versions: HashMap<String, VersionSpec>,
}

impl Compiled {
    /// `source`'s statements.
    pub(crate) fn get(&self, source: &str) -> Option<&Vec<CompiledStatement>> {
        self.statements.get(source)
    }

    /// Every source's statements.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&String, &Vec<CompiledStatement>)> {
        self.statements.iter()
    }
}

/// An event's statements with every parameter's value bound, the body
/// parsed as JSON (if it is JSON), and its version (if its source has one
/// and it carries one). Done before a connection is taken, so a message
/// that cannot be bound (poison) costs no database time.
pub(crate) struct Bound<'s> {
    pub(crate) statements: &'s [CompiledStatement],
    pub(crate) json: Option<Value>,
    pub(crate) values: Vec<Vec<ParamValue>>,
    pub(crate) version: Option<i64>,
}

/// Binds the statements of `event.source` from `event`, and reads its
/// version.
pub(crate) fn bind<'s>(compiled: &'s Compiled, event: &Event<'_>) -> Result<Bound<'s>, SinkError> {
    let statements = compiled.get(event.source).map_or(&[][..], Vec::as_slice);
    let json = parse_body(event.body);
    let version = match compiled.versions.get(event.source) {
        Some(spec) => spec.read(event, json.as_ref())?,
        None => None,
    };
    let values = statements
        .iter()
        .map(|s| s.values(event, json.as_ref(), version))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Bound {
        statements,
        json,
        values,
        version,
    })
}

/// Compiles every source's statements for `dialect`, and the versions of
/// the sources `versions` names (`json:/pointer` or `header:Name`). A
/// statement using `$version` needs its source to have one.
pub(crate) fn compile_all(
    statements: &BTreeMap<String, Vec<StatementSpec>>,
    versions: &BTreeMap<String, String>,
    dialect: Dialect,
) -> Result<Compiled, SinkSetupError> {
    let mut out = Compiled::default();
    for (source, spec) in versions {
        let version = VersionSpec::parse(spec)
            .map_err(|e| SinkSetupError::Settings(format!("source \"{source}\": version {e}")))?;
        out.versions.insert(source.clone(), version);
    }
    for (source, specs) in statements {
        let mut compiled = Vec::with_capacity(specs.len());
        for (index, spec) in specs.iter().enumerate() {
            let error = |message| SinkSetupError::Statement {
                source_name: source.clone(),
                index,
                message,
            };
            let statement = compile(spec, dialect).map_err(error)?;
            if !out.versions.contains_key(source)
                && statement
                    .params
                    .iter()
                    .any(|p| p.source == ParamSource::Version)
            {
                return Err(error(
                    "$version: the source has no version (set version = \"json:/pointer\" or \
                     \"header:Name\" on it)"
                        .to_owned(),
                ));
            }
            compiled.push(statement);
        }
        out.statements.insert(source.clone(), compiled);
    }
    Ok(out)
}

/// Translates one statement's named parameters into positional ones.
pub(crate) fn compile(spec: &StatementSpec, dialect: Dialect) -> Result<CompiledStatement, String> {
    if spec.sql.trim().is_empty() {
        return Err("the SQL is empty".into());
    }
    let (sql, names) = translate(&spec.sql, dialect)?;
    let mut params = Vec::with_capacity(names.len());
    for name in names {
        let source = match (spec.params.get(&name), ParamSource::builtin(&name)) {
            (Some(_), Some(_)) => {
                return Err(format!(
                    "parameter \"{name}\" is built in; remove it from params"
                ));
            }
            (Some(value), None) => {
                ParamSource::parse(value).map_err(|e| format!("parameter \"{name}\": {e}"))?
            }
            (None, Some(builtin)) => builtin,
            (None, None) => {
                return Err(format!(
                    "unknown parameter ${name}: declare it in params (json:/pointer or \
                     header:Name) or use a built-in ($entity, $event_id, $source, $payload, \
                     $version)"
                ));
            }
        };
        params.push(Param { name, source });
    }
    for (name, value) in &spec.params {
        if !params.iter().any(|p| &p.name == name) {
            // Validate the value anyway, so the message is about the real
            // problem when both are wrong.
            ParamSource::parse(value).map_err(|e| format!("parameter \"{name}\": {e}"))?;
            return Err(format!(
                "parameter \"{name}\" is declared in params but ${name} is not in the SQL"
            ));
        }
    }
    Ok(CompiledStatement { sql, params })
}

fn is_ident_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_'
}

fn is_ident_continue(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Rewrites `$name` into positional placeholders; returns the SQL and the
/// distinct names in placeholder order. A name used twice gets one
/// placeholder.
///
/// Left alone: `'...'` and `E'...'` strings, `"..."` identifiers, `--` and
/// `/* */` comments, `$$...$$` and `$tag$...$tag$` text, and a `$` inside an
/// identifier (`a$b`). Rejected: positional parameters (`$1`, and `?` for
/// SQLite), which would collide with the translated ones.
pub(crate) fn translate(sql: &str, dialect: Dialect) -> Result<(String, Vec<String>), String> {
    let bytes = sql.as_bytes();
    let mut out = String::with_capacity(sql.len() + 8);
    let mut names: Vec<String> = Vec::new();
    // Start of the text not yet copied to `out`.
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'\'' => {
                let escapes = i > 0
                    && matches!(bytes[i - 1], b'e' | b'E')
                    && (i < 2 || !is_ident_continue(bytes[i - 2]));
                i = skip_quoted(bytes, i, b'\'', escapes).ok_or("unterminated string literal")?;
            }
            b'"' => {
                i = skip_quoted(bytes, i, b'"', false).ok_or("unterminated quoted identifier")?;
            }
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                i = bytes[i..]
                    .iter()
                    .position(|&c| c == b'\n')
                    .map_or(bytes.len(), |p| i + p + 1);
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i = skip_block_comment(bytes, i).ok_or("unterminated /* comment")?;
            }
            b'?' if dialect == Dialect::Sqlite => {
                return Err("positional parameters (?) are not supported: use $name".into());
            }
            b'$' if i > 0 && is_ident_continue(bytes[i - 1]) => {
                // Part of an identifier such as `a$b`.
                i += 1;
            }
            b'$' => match bytes.get(i + 1) {
                Some(d) if d.is_ascii_digit() => {
                    return Err(
                        "positional parameters ($1, $2, ...) are not supported: use $name".into(),
                    );
                }
                Some(b'$') => {
                    i = skip_dollar_quoted(bytes, i, i + 2).ok_or("unterminated $$ string")?;
                }
                Some(&s) if is_ident_start(s) => {
                    let start = i + 1;
                    let mut end = start;
                    while end < bytes.len() && is_ident_continue(bytes[end]) {
                        end += 1;
                    }
                    if bytes.get(end) == Some(&b'$') {
                        // `$tag$ ... $tag$`.
                        i = skip_dollar_quoted(bytes, i, end + 1)
                            .ok_or("unterminated dollar-quoted string")?;
                        continue;
                    }
                    let name = &sql[start..end];
                    let position = match names.iter().position(|n| n == name) {
                        Some(p) => p,
                        None => {
                            names.push(name.to_owned());
                            names.len() - 1
                        }
                    };
                    out.push_str(&sql[copied..i]);
                    out.push(if dialect == Dialect::Postgres {
                        '$'
                    } else {
                        '?'
                    });
                    out.push_str(&(position + 1).to_string());
                    copied = end;
                    i = end;
                }
                _ => i += 1,
            },
            _ => i += 1,
        }
    }
    out.push_str(&sql[copied..]);
    Ok((out, names))
}

/// From an opening quote at `start`, returns the index after the closing
/// one. A doubled quote is an escaped one; with `backslash`, so is `\'`.
fn skip_quoted(bytes: &[u8], start: usize, quote: u8, backslash: bool) -> Option<usize> {
    let mut i = start + 1;
    while i < bytes.len() {
        let b = bytes[i];
        if backslash && b == b'\\' {
            i += 2;
        } else if b == quote {
            if bytes.get(i + 1) == Some(&quote) {
                i += 2;
            } else {
                return Some(i + 1);
            }
        } else {
            i += 1;
        }
    }
    None
}

/// From `/*` at `start`, returns the index after the matching `*/`
/// (PostgreSQL nests block comments).
fn skip_block_comment(bytes: &[u8], start: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = start;
    while i + 1 < bytes.len() {
        match (bytes[i], bytes[i + 1]) {
            (b'/', b'*') => {
                depth += 1;
                i += 2;
            }
            (b'*', b'/') => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => i += 1,
        }
    }
    None
}

/// The opening tag is `bytes[start..body]` (`$$` or `$tag$`); returns the
/// index after the same closing tag.
fn skip_dollar_quoted(bytes: &[u8], start: usize, body: usize) -> Option<usize> {
    let tag = &bytes[start..body];
    bytes[body..]
        .windows(tag.len())
        .position(|w| w == tag)
        .map(|p| body + p + tag.len())
}

/// A body that is not JSON as the inbox keeps it: a JSON string of its
/// text (invalid UTF-8 replaced), so a non-JSON payload is never stored as
/// NULL.
pub(crate) fn body_as_json_string(body: &[u8]) -> Value {
    // A NUL byte would come out as `\u0000`, which jsonb refuses.
    Value::String(String::from_utf8_lossy(body).replace('\0', "\u{FFFD}"))
}

fn missing(name: &str, what: String) -> SinkError {
    SinkError::permanent("missing_param", format!("parameter ${name}: {what}"))
}

fn invalid_json(name: &str) -> SinkError {
    SinkError::permanent(
        "invalid_json",
        format!("parameter ${name} needs the body as JSON, and it is not valid JSON"),
    )
}

fn extract(
    name: &str,
    source: &ParamSource,
    event: &Event<'_>,
    json: Option<&Value>,
    version: Option<i64>,
) -> Result<ParamValue, SinkError> {
    Ok(match source {
        ParamSource::Entity => ParamValue::Text(
            event
                .entity_key
                .ok_or_else(|| match json {
                    // The likely cause: a JSON pointer could not read it.
                    None => SinkError::permanent(
                        "invalid_json",
                        format!(
                            "parameter ${name}: the event has no entity key, and its body is \
                             not valid JSON (a json: entity key cannot be read from it)"
                        ),
                    ),
                    Some(_) => missing(name, "the event has no entity key".into()),
                })?
                .to_owned(),
        ),
        ParamSource::EventId => ParamValue::Text(event.event_id.to_owned()),
        ParamSource::Source => ParamValue::Text(event.source.to_owned()),
        ParamSource::Payload => ParamValue::Json(json.ok_or_else(|| invalid_json(name))?.clone()),
        ParamSource::Version => version.map_or(ParamValue::Null, |v| ParamValue::Json(v.into())),
        ParamSource::Json(pointer) => {
            let doc = json.ok_or_else(|| invalid_json(name))?;
            match doc.pointer(pointer) {
                None => return Err(missing(name, format!("no value at json:{pointer}"))),
                Some(Value::Null) => ParamValue::Null,
                Some(Value::String(s)) => ParamValue::Text(s.clone()),
                Some(v) => ParamValue::Json(v.clone()),
            }
        }
        ParamSource::Header(h) => ParamValue::Text(
            header(event.headers, h)
                .ok_or_else(|| missing(name, format!("no header {h}")))?
                .to_owned(),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FailureClass;
    use serde_json::json;

    fn spec(sql: &str, params: &[(&str, &str)]) -> StatementSpec {
        StatementSpec {
            sql: sql.into(),
            params: params
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    fn pg(sql: &str) -> (String, Vec<String>) {
        translate(sql, Dialect::Postgres).expect("translates")
    }

    #[test]
    fn named_params_become_positional_in_order_of_first_use() {
        let (sql, names) =
            pg("UPDATE orders SET status = $status, note = $status || $entity WHERE id = $entity");
        assert_eq!(
            sql,
            "UPDATE orders SET status = $1, note = $1 || $2 WHERE id = $2"
        );
        assert_eq!(names, ["status", "entity"]);
        let (sql, _) = translate("SELECT $a::int, $b_2", Dialect::Sqlite).expect("translates");
        assert_eq!(sql, "SELECT ?1::int, ?2");
    }

    #[test]
    fn strings_identifiers_comments_and_dollar_quotes_are_left_alone() {
        let input = "SELECT '$no', 'it''s $no', E'\\'$no', \"$no\", a$no, $$ $no $$, \
                     $tag$ $no $$ $tag$, $yes -- $no\n /* $no /* $no */ */ + $yes";
        let (sql, names) = pg(input);
        assert_eq!(names, ["yes"]);
        assert_eq!(
            sql,
            "SELECT '$no', 'it''s $no', E'\\'$no', \"$no\", a$no, $$ $no $$, \
             $tag$ $no $$ $tag$, $1 -- $no\n /* $no /* $no */ */ + $1"
        );
        // A plain `$` and a trailing one are not parameters.
        assert_eq!(pg("SELECT '$' || $ ").0, "SELECT '$' || $ ");
        assert_eq!(pg("SELECT 1$").0, "SELECT 1$");
        // Multibyte text around parameters survives.
        assert_eq!(pg("SELECT 'é', $x, 'ü'").0, "SELECT 'é', $1, 'ü'");
        // jsonb `?` is an operator in PostgreSQL.
        assert_eq!(pg("SELECT $p ? 'k'").0, "SELECT $1 ? 'k'");
    }

    #[test]
    fn positional_and_unterminated_input_is_rejected() {
        assert!(translate("SELECT $1", Dialect::Postgres).is_err());
        assert!(translate("SELECT ?", Dialect::Sqlite).is_err());
        assert!(translate("SELECT 'oops", Dialect::Postgres).is_err());
        assert!(translate("SELECT $$ oops", Dialect::Postgres).is_err());
        assert!(translate("SELECT /* oops", Dialect::Postgres).is_err());
    }

    #[test]
    fn compile_resolves_params_and_builtins() {
        let c = compile(
            &spec(
                "INSERT INTO t VALUES ($event_id, $source, $entity, $payload, $status, $sig)",
                &[("status", "json:/data/status"), ("sig", "header:X-Sig")],
            ),
            Dialect::Postgres,
        )
        .expect("compiles");
        assert_eq!(c.sql, "INSERT INTO t VALUES ($1, $2, $3, $4, $5, $6)");
        let sources: Vec<_> = c.params.iter().map(|p| p.source.clone()).collect();
        assert_eq!(
            sources,
            [
                ParamSource::EventId,
                ParamSource::Source,
                ParamSource::Entity,
                ParamSource::Payload,
                ParamSource::Json("/data/status".into()),
                ParamSource::Header("X-Sig".into()),
            ]
        );
    }

    #[test]
    fn compile_rejects_config_mistakes() {
        let err = |s: StatementSpec| compile(&s, Dialect::Postgres).expect_err("rejected");
        assert!(err(spec("UPDATE t SET a = $nope", &[])).contains("unknown parameter $nope"));
        assert!(err(spec("UPDATE t SET a = $a", &[("a", "body:/x")])).contains("json:/pointer"));
        assert!(err(spec("UPDATE t SET a = $a", &[("a", "json:x")])).contains("pointer"));
        assert!(err(spec("UPDATE t SET a = $a", &[("a", "header: ")])).contains("header"));
        assert!(err(spec("UPDATE t SET a = 1", &[("a", "json:/a")])).contains("not in the SQL"));
        assert!(
            err(spec("UPDATE t SET a = $entity", &[("entity", "json:/a")])).contains("built in")
        );
        assert!(err(spec("  ", &[])).contains("empty"));
    }

    #[test]
    fn compile_all_names_the_source_and_index() {
        let mut all = BTreeMap::new();
        all.insert(
            "stripe".to_owned(),
            vec![spec("SELECT 1", &[]), spec("SELECT $x", &[])],
        );
        let err = compile_all(&all, &BTreeMap::new(), Dialect::Sqlite).expect_err("rejected");
        match err {
            SinkSetupError::Statement {
                source_name, index, ..
            } => {
                assert_eq!(source_name, "stripe");
                assert_eq!(index, 1);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    fn event<'a>(headers: &'a [(String, String)], body: &'a [u8]) -> Event<'a> {
        Event {
            source: "stripe",
            event_id: "evt_1",
            entity_key: Some("1042"),
            headers,
            body,
            received_at_ms: 0,
            attempt: 1,
        }
    }

    #[test]
    fn values_come_from_json_headers_and_builtins() {
        let headers = vec![("x-shop-domain".to_owned(), "shop.example".to_owned())];
        let body = br#"{"data":{"status":"paid","amount":12.5,"n":3,"ok":true,"obj":{"a":1},"gone":null}}"#;
        let json = parse_body(body);
        let c = compile(
            &spec(
                "SELECT $status, $amount, $n, $ok, $obj, $gone, $shop, $entity, $event_id, $source",
                &[
                    ("status", "json:/data/status"),
                    ("amount", "json:/data/amount"),
                    ("n", "json:/data/n"),
                    ("ok", "json:/data/ok"),
                    ("obj", "json:/data/obj"),
                    ("gone", "json:/data/gone"),
                    ("shop", "header:X-Shop-Domain"),
                ],
            ),
            Dialect::Postgres,
        )
        .expect("compiles");
        let values = c
            .values(&event(&headers, body), json.as_ref(), None)
            .expect("extracts");
        assert_eq!(
            values,
            [
                ParamValue::Text("paid".into()),
                ParamValue::Json(json!(12.5)),
                ParamValue::Json(json!(3)),
                ParamValue::Json(json!(true)),
                ParamValue::Json(json!({"a": 1})),
                ParamValue::Null,
                ParamValue::Text("shop.example".into()),
                ParamValue::Text("1042".into()),
                ParamValue::Text("evt_1".into()),
                ParamValue::Text("stripe".into()),
            ]
        );
        assert_eq!(values[4].to_text().as_deref(), Some(r#"{"a":1}"#));
        assert_eq!(values[0].to_json(), json!("paid"));
    }

    #[test]
    fn version_is_a_builtin_bound_as_an_integer_or_null() {
        let c = compile(
            &spec("UPDATE t SET v = $version WHERE id = $entity", &[]),
            Dialect::Postgres,
        )
        .expect("compiles");
        assert_eq!(c.params[0].source, ParamSource::Version);
        let ev = event(&[], b"{}");
        assert_eq!(
            c.values(&ev, None, Some(1_700_000_000)).expect("values")[0],
            ParamValue::Json(json!(1_700_000_000))
        );
        assert_eq!(
            c.values(&ev, None, None).expect("values")[0],
            ParamValue::Null
        );
        assert!(
            compile(
                &spec("SELECT $version", &[("version", "json:/v")]),
                Dialect::Sqlite
            )
            .expect_err("declared")
            .contains("built in")
        );

        let mut all = BTreeMap::new();
        all.insert("stripe".to_owned(), vec![spec("SELECT $version", &[])]);
        let err = compile_all(&all, &BTreeMap::new(), Dialect::Sqlite).expect_err("no version");
        assert!(err.to_string().contains("$version"), "{err}");
        let mut versions = BTreeMap::new();
        versions.insert("stripe".to_owned(), "json:/created".to_owned());
        let compiled = compile_all(&all, &versions, Dialect::Sqlite).expect("compiles");
        let body = br#"{"created":1700000000}"#;
        let bound = bind(&compiled, &event(&[], body)).expect("binds");
        assert_eq!(bound.version, Some(1_700_000_000));
        assert_eq!(bound.values[0], [ParamValue::Json(json!(1_700_000_000))]);
        versions.insert("stripe".to_owned(), "created".to_owned());
        assert!(compile_all(&all, &versions, Dialect::Sqlite).is_err());
    }

    #[test]
    fn missing_values_and_bad_json_are_permanent() {
        let c = compile(
            &spec("SELECT $status", &[("status", "json:/data/status")]),
            Dialect::Postgres,
        )
        .expect("compiles");
        let body = br#"{"data":{}}"#;
        let err = c
            .values(&event(&[], body), parse_body(body).as_ref(), None)
            .expect_err("missing");
        assert_eq!(
            (err.class, err.kind),
            (FailureClass::Permanent, "missing_param")
        );
        assert!(err.message.contains("$status"), "{err}");

        let err = c
            .values(&event(&[], b"not json"), None, None)
            .expect_err("bad json");
        assert_eq!(
            (err.class, err.kind),
            (FailureClass::Permanent, "invalid_json")
        );

        let h = compile(
            &spec("SELECT $sig", &[("sig", "header:X-Sig")]),
            Dialect::Postgres,
        )
        .expect("compiles");
        let err = h
            .values(&event(&[], b"not json"), None, None)
            .expect_err("no header");
        assert_eq!(err.kind, "missing_param");

        let e = compile(&spec("SELECT $entity", &[]), Dialect::Postgres).expect("compiles");
        let mut ev = event(&[], b"{}");
        ev.entity_key = None;
        assert_eq!(
            e.values(&ev, Some(&json!({})), None)
                .expect_err("no key")
                .kind,
            "missing_param"
        );
        // No key because the body is not JSON: the reason says so.
        let mut ev = event(&[], b"not json");
        ev.entity_key = None;
        let err = e.values(&ev, None, None).expect_err("no key");
        assert_eq!(err.kind, "invalid_json");
        assert!(err.to_string().contains("not valid JSON"), "{err}");
    }
}
