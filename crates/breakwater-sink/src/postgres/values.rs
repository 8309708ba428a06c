//! Parameters as PostgreSQL takes them: a webhook's value (JSON or text)
//! converted to the type PostgreSQL inferred for its `$name`, then encoded.
//!
//! Conversion is the sink's, not the driver's: the types are inferred when
//! a statement is prepared, so `"42"` becomes an `int8` for an `int8`
//! column and stays text for a `text` one, and a value that does not
//! convert is a permanent `data` error naming the parameter (the event goes
//! to the DLQ; retrying would not change it). A domain is bound as its base
//! type.

use bytes::BytesMut;
use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use rust_decimal::Decimal;
use serde_json::Value;
use tokio_postgres::types::{IsNull, Kind, ToSql, Type, to_sql_checked};

use crate::SinkError;
use crate::param::ParamValue;

/// A parameter converted to the type PostgreSQL inferred for it.
#[derive(Debug)]
pub(super) enum PgValue {
    Null,
    Bool(bool),
    I16(i16),
    I32(i32),
    I64(i64),
    F32(f32),
    F64(f64),
    Numeric(Decimal),
    /// Text, and the labels of enum types (their binary form is the label).
    Text(String),
    Json(Value),
    Uuid(uuid::Uuid),
    TimestampTz(DateTime<Utc>),
    Timestamp(NaiveDateTime),
    Date(NaiveDate),
    Array(Vec<PgValue>),
}

impl ToSql for PgValue {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        // A domain's binary form is its base type's: a jsonb domain needs
        // jsonb's version byte, an array domain the array's member type.
        let ty = base_type(ty);
        match self {
            Self::Null => Ok(IsNull::Yes),
            Self::Bool(v) => v.to_sql(ty, out),
            Self::I16(v) => v.to_sql(ty, out),
            Self::I32(v) => v.to_sql(ty, out),
            Self::I64(v) => v.to_sql(ty, out),
            Self::F32(v) => v.to_sql(ty, out),
            Self::F64(v) => v.to_sql(ty, out),
            Self::Numeric(v) => v.to_sql(ty, out),
            Self::Text(v) => {
                out.extend_from_slice(v.as_bytes());
                Ok(IsNull::No)
            }
            Self::Json(v) => v.to_sql(ty, out),
            Self::Uuid(v) => v.to_sql(ty, out),
            Self::TimestampTz(v) => v.to_sql(ty, out),
            Self::Timestamp(v) => v.to_sql(ty, out),
            Self::Date(v) => v.to_sql(ty, out),
            // postgres-types panics on an array bound to a type that is
            // not one; `to_pg` makes arrays only for array types, and this
            // keeps it an error should that ever change.
            Self::Array(v) => match ty.kind() {
                Kind::Array(_) => v.to_sql(ty, out),
                _ => Err(format!("an array bound to {}", ty.name()).into()),
            },
        }
    }

    /// Conversion to the right type happened in [`to_pg`].
    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

fn data_error(name: &str, value: &ParamValue, ty: &Type) -> SinkError {
    let shown = value.to_text().unwrap_or_default();
    let shown: String = shown.chars().take(80).collect();
    SinkError::permanent(
        "data",
        format!(
            "parameter ${name}: \"{shown}\" is not a valid {}",
            ty.name()
        ),
    )
}

fn parse_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "true" | "t" | "yes" | "y" | "on" | "1" => Some(true),
        "false" | "f" | "no" | "n" | "off" | "0" => Some(false),
        _ => None,
    }
}

/// An integer from a JSON number (integral floats included) or text.
fn parse_int(value: &ParamValue) -> Option<i64> {
    match value {
        ParamValue::Json(Value::Number(n)) => n.as_i64().or_else(|| {
            let f = n.as_f64()?;
            // Exactly representable integral floats only (1e3, 42.0).
            (f.fract() == 0.0 && f.abs() < 9.0e15).then_some(f as i64)
        }),
        ParamValue::Text(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn parse_float(value: &ParamValue) -> Option<f64> {
    match value {
        ParamValue::Json(Value::Number(n)) => n.as_f64(),
        ParamValue::Text(s) => s.trim().parse().ok().filter(|f: &f64| f.is_finite()),
        _ => None,
    }
}

/// A `real` from a JSON number or text, refused (as PostgreSQL's own input
/// refuses it) when it is out of `real`'s range: `1e39` would otherwise be
/// stored as `Infinity` and `1e-50` as `0`, since the binary form the sink
/// sends is not range-checked by the server.
fn parse_real(value: &ParamValue) -> Option<f32> {
    let wide = parse_float(value)?;
    let narrow = wide as f32;
    let overflow = narrow.is_infinite();
    let underflow = narrow == 0.0 && wide != 0.0;
    (!overflow && !underflow).then_some(narrow)
}

/// A `numeric` from a JSON number or text, refused when the 96-bit decimal
/// cannot hold it exactly (more than 28 significant digits, or a scale past
/// 28): rounding it would store a different amount than the webhook sent.
/// (A JSON number that is not an integer was already read as an `f64` with
/// the body; an amount that needs more than 15 digits belongs in a string.)
fn parse_decimal(value: &ParamValue) -> Option<Decimal> {
    let text = match value {
        ParamValue::Json(Value::Number(n)) => n.to_string(),
        ParamValue::Text(s) => s.trim().to_owned(),
        _ => return None,
    };
    match text.split_once(['e', 'E']) {
        // The exponent only moves the point or multiplies, exactly or with
        // an error; the digits must fit as they are.
        Some((digits, _)) => {
            Decimal::from_str_exact(digits).ok()?;
            Decimal::from_scientific(&text).ok()
        }
        None => Decimal::from_str_exact(&text).ok(),
    }
}

/// Seconds since the epoch (a JSON number, as Stripe sends `created`) or
/// RFC 3339 text.
fn parse_timestamptz(value: &ParamValue) -> Option<DateTime<Utc>> {
    match value {
        ParamValue::Json(Value::Number(n)) => {
            let secs = n.as_f64()?;
            DateTime::from_timestamp_millis((secs * 1000.0).round() as i64)
        }
        ParamValue::Text(s) => DateTime::parse_from_rfc3339(s.trim())
            .ok()
            .map(|t| t.with_timezone(&Utc)),
        _ => None,
    }
}

fn parse_timestamp(value: &ParamValue) -> Option<NaiveDateTime> {
    if let ParamValue::Text(s) = value {
        let s = s.trim();
        for format in ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f"] {
            if let Ok(t) = NaiveDateTime::parse_from_str(s, format) {
                return Some(t);
            }
        }
    }
    parse_timestamptz(value).map(|t| t.naive_utc())
}

/// Converts `value` to `ty`, the type PostgreSQL inferred for `$name`.
pub(super) fn to_pg(value: &ParamValue, ty: &Type, name: &str) -> Result<PgValue, SinkError> {
    if *value == ParamValue::Null {
        return Ok(PgValue::Null);
    }
    let bad = || data_error(name, value, ty);
    match ty.kind() {
        Kind::Domain(inner) => return to_pg(value, inner, name),
        Kind::Enum(_) => return value.to_text().map(PgValue::Text).ok_or_else(bad),
        Kind::Array(member) => {
            return match value {
                ParamValue::Json(Value::Array(items)) => items
                    .iter()
                    .map(|item| {
                        let item = match item {
                            Value::Null => ParamValue::Null,
                            Value::String(s) => ParamValue::Text(s.clone()),
                            other => ParamValue::Json(other.clone()),
                        };
                        to_pg(&item, member, name)
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(PgValue::Array),
                _ => Err(bad()),
            };
        }
        _ => {}
    }
    let converted = match *ty {
        Type::BOOL => match value {
            ParamValue::Json(Value::Bool(b)) => Some(*b),
            ParamValue::Text(s) => parse_bool(s),
            _ => None,
        }
        .map(PgValue::Bool),
        Type::INT2 => parse_int(value)
            .and_then(|v| i16::try_from(v).ok())
            .map(PgValue::I16),
        Type::INT4 => parse_int(value)
            .and_then(|v| i32::try_from(v).ok())
            .map(PgValue::I32),
        Type::INT8 => parse_int(value).map(PgValue::I64),
        Type::FLOAT4 => parse_real(value).map(PgValue::F32),
        Type::FLOAT8 => parse_float(value).map(PgValue::F64),
        Type::NUMERIC => parse_decimal(value).map(PgValue::Numeric),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
            value.to_text().map(PgValue::Text)
        }
        Type::JSON | Type::JSONB => Some(PgValue::Json(value.to_json())),
        Type::UUID => value
            .to_text()
            .and_then(|s| uuid::Uuid::parse_str(s.trim()).ok())
            .map(PgValue::Uuid),
        Type::TIMESTAMPTZ => parse_timestamptz(value).map(PgValue::TimestampTz),
        Type::TIMESTAMP => parse_timestamp(value).map(PgValue::Timestamp),
        Type::DATE => value
            .to_text()
            .and_then(|s| NaiveDate::parse_from_str(s.trim(), "%Y-%m-%d").ok())
            .map(PgValue::Date),
        _ if ty.name() == "citext" => value.to_text().map(PgValue::Text),
        _ => {
            return Err(SinkError::permanent(
                "sql",
                format!(
                    "parameter ${name} has type {}, which the sink does not bind; \
                     cast it in the SQL, e.g. ${name}::text::{}",
                    ty.name(),
                    ty.name()
                ),
            ));
        }
    };
    converted.ok_or_else(bad)
}

/// `ty` with its domains unwrapped.
fn base_type(ty: &Type) -> &Type {
    match ty.kind() {
        Kind::Domain(inner) => base_type(inner),
        _ => ty,
    }
}

/// `value` converted to `ty` and encoded once, as tokio-postgres will
/// encode it.
///
/// The encoding is checked here, before `BEGIN`, because tokio-postgres
/// encodes a statement's parameters when the statement is sent: one that
/// failed to encode there would not be sent, while the `COMMIT` pipelined
/// behind it would be, and would commit the inbox row without that
/// statement's effect. `scratch` is reused across the parameters.
pub(super) fn bind_param(
    value: &ParamValue,
    ty: &Type,
    name: &str,
    scratch: &mut BytesMut,
) -> Result<PgValue, SinkError> {
    let converted = to_pg(value, ty, name)?;
    scratch.clear();
    converted.to_sql_checked(ty, scratch).map_err(|e| {
        SinkError::permanent(
            "data",
            format!("parameter ${name}: cannot be sent as {}: {e}", ty.name()),
        )
    })?;
    Ok(converted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn text(s: &str) -> ParamValue {
        ParamValue::Text(s.into())
    }

    #[test]
    fn a_real_out_of_range_is_refused_not_stored_as_infinity_or_zero() {
        for refused in [text("1e39"), text("-1e39"), text("1e-50")] {
            let e = to_pg(&refused, &Type::FLOAT4, "r").expect_err("out of range");
            assert!(e.to_string().contains("is not a valid float4"), "{e}");
        }
        assert!(to_pg(&ParamValue::Json(json!(1e39)), &Type::FLOAT4, "r").is_err());
        assert!(matches!(
            to_pg(&text("3.4e38"), &Type::FLOAT4, "r"),
            Ok(PgValue::F32(v)) if v.is_finite() && v > 3.39e38
        ));
        assert!(matches!(
            to_pg(&ParamValue::Json(json!(0.0)), &Type::FLOAT4, "r"),
            Ok(PgValue::F32(v)) if v == 0.0
        ));
        // float8 holds what float4 cannot.
        assert!(matches!(
            to_pg(&text("1e39"), &Type::FLOAT8, "r"),
            Ok(PgValue::F64(v)) if v == 1e39
        ));
    }

    #[test]
    fn a_numeric_the_decimal_cannot_hold_exactly_is_refused_not_rounded() {
        for refused in [
            "1.00000000000000000000000000001",
            "123456789012345678901234567890",
            "1.5e-28",
            "1e-30",
            "1.00000000000000000000000000001e2",
        ] {
            let e = to_pg(&text(refused), &Type::NUMERIC, "a").expect_err(refused);
            assert!(e.to_string().contains("is not a valid numeric"), "{e}");
        }
        for (kept, shown) in [
            (
                "1.0000000000000000000000000001",
                "1.0000000000000000000000000001",
            ),
            ("12345678901234567890.12", "12345678901234567890.12"),
            ("2.5e-27", "0.0000000000000000000000000025"),
            ("1.2E10", "12000000000"),
            ("-0.01", "-0.01"),
        ] {
            match to_pg(&text(kept), &Type::NUMERIC, "a") {
                Ok(PgValue::Numeric(d)) => assert_eq!(d.to_string(), shown, "{kept}"),
                other => panic!("{kept}: {other:?}"),
            }
        }
    }

    #[test]
    fn values_convert_to_inferred_types() {
        assert!(matches!(
            to_pg(&text("1042"), &Type::INT8, "e"),
            Ok(PgValue::I64(1042))
        ));
        assert!(matches!(
            to_pg(&ParamValue::Json(json!(7)), &Type::INT4, "n"),
            Ok(PgValue::I32(7))
        ));
        assert!(matches!(
            to_pg(&ParamValue::Json(json!(3.0)), &Type::INT2, "n"),
            Ok(PgValue::I16(3))
        ));
        assert!(matches!(
            to_pg(&text("t"), &Type::BOOL, "b"),
            Ok(PgValue::Bool(true))
        ));
        match to_pg(&ParamValue::Json(json!(12.50)), &Type::NUMERIC, "a") {
            Ok(PgValue::Numeric(d)) => assert_eq!(d.to_string(), "12.5"),
            other => panic!("{other:?}"),
        }
        match to_pg(&text("1e3"), &Type::NUMERIC, "a") {
            Ok(PgValue::Numeric(d)) => assert_eq!(d, Decimal::from(1000)),
            other => panic!("{other:?}"),
        }
        match to_pg(&ParamValue::Json(json!({"a": 1})), &Type::TEXT, "o") {
            Ok(PgValue::Text(s)) => assert_eq!(s, r#"{"a":1}"#),
            other => panic!("{other:?}"),
        }
        match to_pg(&text("paid"), &Type::JSONB, "s") {
            Ok(PgValue::Json(v)) => assert_eq!(v, json!("paid")),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            to_pg(
                &ParamValue::Json(json!(1_700_000_000)),
                &Type::TIMESTAMPTZ,
                "t"
            ),
            Ok(PgValue::TimestampTz(_))
        ));
        assert!(matches!(
            to_pg(&text("2026-11-02T10:00:00Z"), &Type::TIMESTAMPTZ, "t"),
            Ok(PgValue::TimestampTz(_))
        ));
        assert!(matches!(
            to_pg(&ParamValue::Json(json!([1, 2])), &Type::INT8_ARRAY, "ids"),
            Ok(PgValue::Array(v)) if v.len() == 2
        ));
        assert!(matches!(
            to_pg(&ParamValue::Null, &Type::INT8, "x"),
            Ok(PgValue::Null)
        ));
    }

    #[test]
    fn unparsable_values_are_permanent_data_errors() {
        for (value, ty) in [
            (text("abc"), Type::INT8),
            (text("70000"), Type::INT2),
            (ParamValue::Json(json!(1.5)), Type::INT4),
            (text("maybe"), Type::BOOL),
            (text("12,5"), Type::NUMERIC),
            (text("not-a-uuid"), Type::UUID),
            (text("yesterday"), Type::TIMESTAMPTZ),
        ] {
            let err = to_pg(&value, &ty, "p").expect_err("rejected");
            assert!(err.is_permanent(), "{err}");
            assert_eq!(err.kind, "data", "{err}");
            assert!(err.message.contains("$p"), "{err}");
        }
        let err = to_pg(&text("10.0.0.1"), &Type::INET, "ip").expect_err("unsupported");
        assert_eq!(err.kind, "sql");
        assert!(err.message.contains("::text::inet"), "{err}");
    }

    /// A domain over `base`, as the server would describe it.
    fn domain(name: &str, oid: u32, base: Type) -> Type {
        Type::new(name.into(), oid, Kind::Domain(base), "public".into())
    }

    #[test]
    fn a_domain_is_encoded_as_its_base_type() {
        let jsonb_domain = domain("jdom", 90_001, Type::JSONB);
        let mut scratch = BytesMut::new();
        bind_param(&text("paid"), &jsonb_domain, "s", &mut scratch).expect("binds");
        // jsonb's binary form: version 1, then the text.
        assert_eq!(&scratch[..], b"\x01\"paid\"");
    }

    #[test]
    fn an_array_domain_binds_instead_of_panicking() {
        let array_domain = domain("adom", 90_002, Type::INT4_ARRAY);
        let mut scratch = BytesMut::new();
        bind_param(
            &ParamValue::Json(json!([1, 2, 3])),
            &array_domain,
            "ids",
            &mut scratch,
        )
        .expect("binds");
        assert!(!scratch.is_empty());
    }

    #[test]
    fn an_array_bound_to_a_type_that_is_not_one_is_an_error() {
        let mut scratch = BytesMut::new();
        let array = PgValue::Array(vec![PgValue::I32(1)]);
        match array.to_sql_checked(&Type::INT4, &mut scratch) {
            Err(err) => assert!(err.to_string().contains("int4"), "{err}"),
            Ok(_) => panic!("an array encoded as int4"),
        }
    }
}
