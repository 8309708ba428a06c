//! Environment overrides: `BREAKWATER_<SECTION>_<KEY>` applied on top of
//! the file's table, one variable at a time, so an error names its
//! variable (and never its value, which may be a secret).

use super::Config;
use super::parse_error::hide_values;

/// Prefix of every environment override.
pub const ENV_PREFIX: &str = "BREAKWATER_";

/// Variables under [`ENV_PREFIX`] of the form `<WORD>_<WORD>` that are not
/// config overrides (and `BREAKWATER_TEST_*`, the test suite's).
/// `BREAKWATER_CONFIG` has no second word and never reaches the check.
pub(super) const NOT_CONFIG: &[&str] = &["BREAKWATER_CHART_FONT"];

/// Sections that environment variables may override.
pub(super) const ENV_SECTIONS: &[&str] = &[
    "ingress", "admin", "queue", "sink", "workers", "breaker", "fleet",
];

/// Sets `[section] key` in `table` from an environment value and reads the
/// whole table again. The value is read as TOML first (`20`, `true`,
/// `["a","b"]`) and, should the config refuse that, as the string it is (a
/// token `123456` stays a string). The error message never repeats the
/// value: it may be a secret.
pub(super) fn apply_env(
    table: &mut toml::Table,
    section: &str,
    key: &str,
    raw: &str,
) -> Result<Config, String> {
    let mut last = String::new();
    for value in [parse_env_value(raw), toml::Value::String(raw.to_owned())] {
        let toml::Value::Table(section_table) = table
            .entry(section.to_owned())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        else {
            return Err(format!("[{section}] is not a table in the file"));
        };
        section_table.insert(key.to_owned(), value);
        match toml::Value::Table(table.clone()).try_into::<Config>() {
            // `[queue]` holds the backend's own keys untyped: they are
            // read by the backend, which must take the value too.
            Ok(config) => match crate::queue::check(&config.queue) {
                Err(problem) if section == "queue" => last = problem.message,
                _ => return Ok(config),
            },
            Err(e) => last = e.message().to_owned(),
        }
    }
    Err(format!("{section}.{key}: {}", hide_values(&last)))
}

/// Reads an environment value as a TOML value when it parses as one
/// (`20`, `true`, `["a","b"]`), else as a string.
fn parse_env_value(raw: &str) -> toml::Value {
    let doc = format!("v = {raw}");
    match toml::from_str::<toml::Table>(&doc) {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(raw.to_owned())),
        Err(_) => toml::Value::String(raw.to_owned()),
    }
}
