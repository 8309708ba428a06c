//! Parse errors that name the key, its table and its line, and never show
//! a value (it may be a secret).

/// Where and what: "line N, column C (`section.key`): message", the key
/// named with the table it sits in as validation names it
/// (`workers.max_concurrency`, `source[0].secrets` in the first
/// `[[source]]`, `source[1].statement[0].sql`). Unlike the error's own
/// rendering it does not quote the offending line, and it hides the value
/// in a type error: either may be a secret (`secrets = "whsec_…"` written
/// as a string, not a list). A syntax error names no key (see
/// [`names_a_field`]).
pub(super) fn describe_parse_error(text: &str, e: &toml::de::Error) -> String {
    let message = hide_values(e.message().trim_end());
    let Some(span) = e.span() else {
        return message;
    };
    let start = span.start.min(text.len());
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let line = text[..start].matches('\n').count() + 1;
    let column = text[line_start..start].chars().count() + 1;
    let line_text = text[line_start..].lines().next().unwrap_or("");
    let key = line_text
        .split_once('=')
        .map(|(key, _)| key.trim())
        .filter(|key| {
            names_a_field(e.message()) && bare_path(key) && key.split('.').all(plausible_key)
        });
    match key {
        Some(key) => {
            let key = match table_at(&text[..line_start]) {
                Some(table) => format!("{table}.{key}"),
                None => key.to_owned(),
            };
            format!("line {line}, column {column} (`{key}`): {message}")
        }
        None => format!("line {line}, column {column}: {message}"),
    }
}

/// Whether `message` is about a field of a file that parsed: serde's
/// complaints about a key it does not know or a value of the wrong type.
/// Only then is the error's line a `key = value` line of the document; a
/// syntax error's line may be anything, a secret pasted unquoted into a
/// list or a table included, and its text is not shown.
fn names_a_field(message: &str) -> bool {
    [
        "unknown field",
        "invalid type",
        "invalid value",
        "invalid length",
        "unknown variant",
    ]
    .iter()
    .any(|start| message.starts_with(start))
}

/// Whether `name` is a bare key or a dotted path of bare keys.
fn bare_path(name: &str) -> bool {
    name.split('.').all(|part| {
        !part.is_empty()
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
    })
}

/// The table that the text after `before` sits in, from its table
/// headers: `workers` under `[workers]`, `source[0]` under the first
/// `[[source]]`, `source[1].statement[0]` under the first
/// `[[source.statement]]` of the second source; `None` at the top level,
/// or under a header this cannot read (a quoted key), rather than a wrong
/// name.
pub(super) fn table_at(before: &str) -> Option<String> {
    // How many items each array of tables has had so far; a new item of
    // an array starts the arrays nested in it afresh.
    let mut items: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut last = None;
    for header in top_level_lines(before).filter_map(table_header) {
        if let TableHeader::ArrayItem(name) = header {
            *items.entry(name).or_default() += 1;
            items.retain(|nested, _| {
                !(nested.len() > name.len()
                    && nested.starts_with(name)
                    && nested.as_bytes()[name.len()] == b'.')
            });
        }
        last = Some(header);
    }
    let name = match last? {
        TableHeader::Table(name) | TableHeader::ArrayItem(name) => name,
        TableHeader::Unreadable => return None,
    };
    // Each prefix that is an array of tables gets its current item.
    let mut path = String::new();
    for (end, part) in name
        .match_indices('.')
        .map(|(i, _)| i)
        .chain([name.len()])
        .zip(name.split('.'))
    {
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(part);
        if let Some(n) = items.get(&name[..end]) {
            path.push_str(&format!("[{}]", n - 1));
        }
    }
    Some(path)
}

/// The lines of `text` that start outside every string, array and inline
/// table: the only ones that can be table headers (a line of a multi-line
/// SQL string may well read `[orders]`).
pub(super) fn top_level_lines(text: &str) -> impl Iterator<Item = &str> {
    #[derive(PartialEq)]
    enum In {
        Code,
        Comment,
        Basic,
        Literal,
        MultiBasic,
        MultiLiteral,
    }
    let bytes = text.as_bytes();
    let mut starts = vec![0];
    let (mut at, mut depth, mut state) = (0, 0usize, In::Code);
    while at < bytes.len() {
        let rest = &bytes[at..];
        let (step, next) = match (&state, rest[0]) {
            (In::Code, b'#') => (1, In::Comment),
            (In::Code, b'"') if rest.starts_with(b"\"\"\"") => (3, In::MultiBasic),
            (In::Code, b'\'') if rest.starts_with(b"'''") => (3, In::MultiLiteral),
            (In::Code, b'"') => (1, In::Basic),
            (In::Code, b'\'') => (1, In::Literal),
            (In::Code, b'[' | b'{') => {
                depth += 1;
                (1, In::Code)
            }
            (In::Code, b']' | b'}') => {
                depth = depth.saturating_sub(1);
                (1, In::Code)
            }
            (In::Basic | In::MultiBasic, b'\\') => (2, state),
            (In::Basic, b'"') | (In::Literal, b'\'') => (1, In::Code),
            (In::MultiBasic, b'"') if rest.starts_with(b"\"\"\"") => (3, In::Code),
            (In::MultiLiteral, b'\'') if rest.starts_with(b"'''") => (3, In::Code),
            (In::Comment | In::Basic | In::Literal, b'\n') => (1, In::Code),
            _ => (1, state),
        };
        state = next;
        at += step;
        // A header line opens and closes its brackets on itself: what
        // counts is the depth where a line starts.
        if at <= bytes.len() && bytes[at - 1] == b'\n' && state == In::Code && depth == 0 {
            starts.push(at);
        }
    }
    starts
        .into_iter()
        .filter_map(move |start| text.get(start..)?.lines().next())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TableHeader<'a> {
    /// `[name]`
    Table(&'a str),
    /// `[[name]]`
    ArrayItem(&'a str),
    /// A header with quoted keys or spaced dots: not named.
    Unreadable,
}

/// A line's table header, if it is one (a comment may follow it). A line
/// of a multi-line array may start with `[` too; one holding a comma, or
/// nothing, is taken for that.
pub(super) fn table_header(line: &str) -> Option<TableHeader<'_>> {
    let line = line.split('#').next().unwrap_or("").trim();
    let (inner, array) = match line.strip_prefix("[[").and_then(|l| l.strip_suffix("]]")) {
        Some(inner) => (inner.trim(), true),
        None => (line.strip_prefix('[')?.strip_suffix(']')?.trim(), false),
    };
    if inner.is_empty() || inner.contains(',') {
        return None;
    }
    Some(match (bare_path(inner), array) {
        (false, _) => TableHeader::Unreadable,
        (true, true) => TableHeader::ArrayItem(inner),
        (true, false) => TableHeader::Table(inner),
    })
}

/// A deserialization message with the value it quotes hidden: serde quotes
/// the offending value in "invalid type", "invalid value", "invalid
/// length" and "unknown variant" messages, and it may be a secret. Other
/// messages quote keys ("unknown field"), which stay.
pub(super) fn hide_values(message: &str) -> String {
    if let Some(rest) = message.strip_prefix("unknown field `")
        && let Some((name, tail)) = rest.split_once('`')
        && !plausible_key(name)
    {
        // A secret pasted where a key goes (or a line broken around one)
        // parses as an unknown key: name it only when it looks like one.
        return format!("unknown field (a name that is not a config key, not shown){tail}");
    }
    if message.starts_with("invalid") || message.starts_with("unknown variant") {
        // What serde expected (the valid choices, a type) is never secret:
        // only the part before it quotes the value.
        match message.split_once(", expected") {
            Some((value, expected)) => format!("{}, expected{expected}", hide_quoted(value)),
            None => hide_quoted(message),
        }
    } else {
        message.to_owned()
    }
}

/// Whether `name` could be a key of Breakwater's config, misspelt: short
/// lower-case snake case, no long run of digits, no well-known secret
/// prefix. Anything else is not echoed in an error (it may be a secret).
fn plausible_key(name: &str) -> bool {
    const SECRET_PREFIXES: &[&str] = &[
        "whsec_", "shpss_", "shpat_", "shpca_", "sk_", "rk_", "ghp_", "gho_", "ghs_", "xox",
    ];
    let mut digits = 0;
    name.len() <= 40
        && !SECRET_PREFIXES.iter().any(|p| name.starts_with(p))
        && name.chars().all(|c| {
            digits = if c.is_ascii_digit() { digits + 1 } else { 0 };
            digits < 4 && (c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
        })
}

/// `text` with every quoted part (between backticks or double quotes)
/// replaced by "(value not shown)".
fn hide_quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '`' || c == '"' {
            out.push_str("(value not shown)");
            for inner in chars.by_ref() {
                if inner == c {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The line (from 1) where the file sets `key`, named as validation names
/// it (`queue.lease_ms`, `sink.url`); `None` for a key the file does not
/// set (a default, an environment override) or inside an array of tables.
pub(super) fn key_line(text: &str, key: &str) -> Option<usize> {
    let (table, name) = key.rsplit_once('.')?;
    if !bare_path(table) || !bare_path(name) {
        return None;
    }
    let mut in_table = false;
    for line in top_level_lines(text) {
        if let Some(header) = table_header(line) {
            in_table = header == TableHeader::Table(table);
            continue;
        }
        let sets = line.split_once('=').is_some_and(|(k, _)| k.trim() == name);
        if in_table && sets {
            let offset = line.as_ptr() as usize - text.as_ptr() as usize;
            return Some(text[..offset].matches('\n').count() + 1);
        }
    }
    None
}
