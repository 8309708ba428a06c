//! The process's log: stderr, filtered by `RUST_LOG`, as text or JSON, and
//! safe whatever `RUST_LOG` says.
//!
//! Two rules hold for every filter a user writes:
//!
//! - **Dependencies never log below INFO.** tokio-postgres logs each
//!   statement's parameters at DEBUG (a payload's card fields among them),
//!   hyper its pool's URLs (credentials in the userinfo), lapin, rdkafka,
//!   async-nats and the AWS SDK the messages and requests they carry.
//!   Breakwater's own debug lines carry ids, keys and outcomes, never a
//!   payload; a dependency's cannot be vetted, so its DEBUG and TRACE
//!   events are dropped before `RUST_LOG` is consulted.
//! - **One event is one line.** In the text format every control
//!   character of an event (a newline in a request path, a signed event id
//!   or an error message) is written escaped (`\n`, `\x1b`), so a field
//!   cannot start a line that looks like a genuine entry. The JSON format
//!   escapes them itself.

use std::borrow::Cow;
use std::io::{self, Write};

use tracing::{Level, Metadata};
use tracing_subscriber::filter::{EnvFilter, FilterExt, filter_fn};
use tracing_subscriber::prelude::*;

/// How the log is written (`--log-format`). The variants carry no doc
/// comments: clap would list them in every command's `--help` and switch
/// it to its long layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

/// Logs to stderr, filtered by `RUST_LOG`, else at `default` and above.
/// lapin's own channel log is off by default: it reports at error level
/// every channel the broker closes, which the RabbitMQ backend does on
/// purpose (a passive declare of a queue that may be missing, a DLQ scan
/// handing its messages back), and the backend reports real failures
/// itself.
pub(crate) fn init(default: &str, format: LogFormat) {
    let wanted = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("{default},lapin::channel=off")));
    let filter = filter_fn(safe_to_log).and(wanted);
    match format {
        LogFormat::Text => {
            let ansi = io::IsTerminal::is_terminal(&io::stderr());
            let layer = tracing_subscriber::fmt::layer()
                .with_ansi(ansi)
                .with_writer(move || OneLine::new(io::stderr(), ansi))
                .with_filter(filter);
            tracing_subscriber::registry().with(layer).init();
        }
        LogFormat::Json => {
            let layer = tracing_subscriber::fmt::layer()
                .json()
                .with_current_span(false)
                .with_writer(io::stderr)
                .with_filter(filter);
            tracing_subscriber::registry().with(layer).init();
        }
    }
}

/// Whether an event or span may be logged at all: Breakwater's own at any
/// level, a dependency's at INFO and above.
fn safe_to_log(meta: &Metadata<'_>) -> bool {
    meta.target().starts_with("breakwater") || *meta.level() <= Level::INFO
}

/// A writer that escapes every control character of what it is given,
/// but the newline that ends it: the text formatter hands it one whole
/// event at a time.
pub(crate) struct OneLine<W> {
    inner: W,
    /// Keep ESC as it is: the formatter colours its own output (and
    /// escapes ESC inside field values itself).
    keep_escape: bool,
}

impl<W> OneLine<W> {
    pub(crate) fn new(inner: W, keep_escape: bool) -> Self {
        Self { inner, keep_escape }
    }
}

impl<W: Write> Write for OneLine<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner
            .write_all(&escape_controls(buf, self.keep_escape))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// `event` with its control characters escaped: C0 but tab (`\n`, `\r`,
/// `\x00`...), DEL, and the C1 range (U+0080-U+009F, NEL among them); a
/// final newline stays.
fn escape_controls(event: &[u8], keep_escape: bool) -> Cow<'_, [u8]> {
    let (body, end) = match event.split_last() {
        Some((b'\n', body)) => (body, &b"\n"[..]),
        _ => (event, &b""[..]),
    };
    let is_c1 =
        |i: usize| body[i] == 0xC2 && body.get(i + 1).is_some_and(|b| (0x80..=0x9F).contains(b));
    let escaped = |i: usize| {
        let b = body[i];
        (b < 0x20 && b != b'\t' && !(keep_escape && b == 0x1B)) || b == 0x7F || is_c1(i)
    };
    if !(0..body.len()).any(escaped) {
        return Cow::Borrowed(event);
    }
    let mut out = Vec::with_capacity(event.len() + 16);
    let mut i = 0;
    while i < body.len() {
        let b = body[i];
        if !escaped(i) {
            out.push(b);
        } else if is_c1(i) {
            out.extend_from_slice(format!("\\u{{{:x}}}", body[i + 1]).as_bytes());
            i += 1;
        } else {
            match b {
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                _ => out.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
            }
        }
        i += 1;
    }
    out.extend_from_slice(end);
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escaped(s: &str, keep_escape: bool) -> String {
        String::from_utf8(escape_controls(s.as_bytes(), keep_escape).into_owned()).expect("utf-8")
    }

    #[test]
    fn an_event_stays_on_its_line() {
        let forged = "WARN refused source=a\n2026-12-07T00:00:00Z  INFO breaker reset\r\n";
        assert_eq!(
            escaped(forged, false),
            "WARN refused source=a\\n2026-12-07T00:00:00Z  INFO breaker reset\\r\n"
        );
        assert_eq!(
            escaped("a\u{0}b\u{7f}c\u{85}d\u{2028}\n", false),
            "a\\x00b\\x7fc\\u{85}d\u{2028}\n"
        );
    }

    #[test]
    fn plain_lines_tabs_and_text_are_kept_as_they_are() {
        for line in [
            "INFO ready listen=127.0.0.1:8080\n",
            "tab\there é ü 日本\n",
            "no newline",
        ] {
            assert!(matches!(
                escape_controls(line.as_bytes(), false),
                Cow::Borrowed(_)
            ));
        }
    }

    #[test]
    fn escape_is_kept_only_when_the_formatter_colours() {
        assert_eq!(
            escaped("\u{1b}[2mINFO\u{1b}[0m\n", true),
            "\u{1b}[2mINFO\u{1b}[0m\n"
        );
        assert_eq!(escaped("\u{1b}[2mINFO\n", false), "\\x1b[2mINFO\n");
    }

    #[test]
    fn the_writer_reports_every_byte_taken() {
        let mut out = Vec::new();
        let mut w = OneLine::new(&mut out, false);
        w.write_all(b"a\nb\n").expect("write");
        assert_eq!(out, b"a\\nb\n");
    }

    #[test]
    fn only_dependencies_are_held_to_info() {
        use tracing::callsite::Identifier;
        use tracing::field::FieldSet;
        use tracing::metadata::Kind;
        struct Site;
        impl tracing::callsite::Callsite for Site {
            fn set_interest(&self, _: tracing::subscriber::Interest) {}
            fn metadata(&self) -> &Metadata<'_> {
                unreachable!("not registered")
            }
        }
        static SITE: Site = Site;
        let meta = |target: &'static str, level: Level| {
            Metadata::new(
                "e",
                target,
                level,
                None,
                None,
                None,
                FieldSet::new(&[], Identifier(&SITE)),
                Kind::EVENT,
            )
        };
        assert!(safe_to_log(&meta("breakwater::worker", Level::TRACE)));
        assert!(safe_to_log(&meta(
            "breakwater_sink::postgres",
            Level::DEBUG
        )));
        assert!(safe_to_log(&meta("tokio_postgres::query", Level::INFO)));
        assert!(safe_to_log(&meta("hyper_util::client", Level::WARN)));
        assert!(!safe_to_log(&meta("tokio_postgres::query", Level::DEBUG)));
        assert!(!safe_to_log(&meta("lapin::channel", Level::TRACE)));
    }
}
