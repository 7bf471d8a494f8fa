//! The functions and filters chat templates call that minijinja lacks or writes differently from
//! Hugging Face's renderer: `strftime_now` (transformers' function: the current time, formatted
//! as Python's `strftime` does; here in UTC) and `tojson` as transformers writes it
//! (`json.dumps(x, ensure_ascii=False)`: `", "` and `": "` between items, no HTML escaping;
//! minijinja's own writes `{"a":1}` and escapes `<`, `>`, `&` and `'`, which would change what
//! the model sees in tool definitions, call arguments and tool results).

use minijinja::value::Kwargs;
use minijinja::{Error, ErrorKind, Value};
use serde::Serialize;
use std::io;

/// Python's `json.dumps` separators without indentation: `", "` and `": "`.
struct PythonCompact;

impl serde_json::ser::Formatter for PythonCompact {
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }
}

/// `x | tojson` and `x | tojson(indent=n)` as transformers renders them.
pub(super) fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(i) => Some(i),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    // transformers passes these through to `json.dumps`; key order is kept as given.
    let _: Option<bool> = kwargs.get("sort_keys")?;
    let _: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(usize::try_from(v)?),
    };
    let mut out = Vec::new();
    let written = match indent {
        Some(n) => {
            let spaces = " ".repeat(n);
            let f = serde_json::ser::PrettyFormatter::with_indent(spaces.as_bytes());
            value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, f))
        }
        None => value.serialize(&mut serde_json::Serializer::with_formatter(
            &mut out,
            PythonCompact,
        )),
    };
    written.map_err(|e| {
        Error::new(ErrorKind::InvalidOperation, "cannot serialize to JSON").with_source(e)
    })?;
    let text = String::from_utf8(out).expect("serde_json writes UTF-8");
    Ok(Value::from_safe_string(text))
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// The civil date (year, month 1..=12, day 1..=31) of a day counted from 1970-01-01
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The day counted from 1970-01-01 of a civil date (the inverse of `civil_from_days`).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let (era, yoe) = (y.div_euclid(400), y.rem_euclid(400));
    let mp = i64::from((month + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468
}

/// `format` (Python's `strftime` directives `%Y %y %m %d %e %B %b %A %a %H %M %S %j %%`) at
/// `secs` seconds after the Unix epoch, in UTC.
pub(super) fn strftime_at(format: &str, secs: i64) -> Result<String, Error> {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let month_name = MONTHS[month as usize - 1];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let field = match chars.next() {
            Some('Y') => year.to_string(),
            Some('y') => format!("{:02}", year.rem_euclid(100)),
            Some('m') => format!("{month:02}"),
            Some('d') => format!("{day:02}"),
            Some('e') => format!("{day:>2}"),
            Some('B') => month_name.to_string(),
            Some('b') => month_name[..3].to_string(),
            Some('A') => WEEKDAYS[weekday].to_string(),
            Some('a') => WEEKDAYS[weekday][..3].to_string(),
            Some('H') => format!("{:02}", rem / 3600),
            Some('M') => format!("{:02}", rem % 3600 / 60),
            Some('S') => format!("{:02}", rem % 60),
            Some('j') => format!("{day_of_year:03}"),
            Some('%') => "%".to_string(),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "strftime_now: %{} is not supported",
                        other.map(String::from).unwrap_or_default()
                    ),
                ))
            }
        };
        out.push_str(&field);
    }
    Ok(out)
}

/// `strftime_now(format)`: the current time (UTC) formatted as Python's `strftime`.
pub(super) fn strftime_now(format: &str) -> Result<String, Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    strftime_at(format, secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_formatted_as_python_does() {
        // 2024-02-29 13:05:09 UTC, a Thursday, day 60 of a leap year.
        let t = 1_709_211_909;
        assert_eq!(
            strftime_at("%Y-%m-%d %H:%M:%S", t).unwrap(),
            "2024-02-29 13:05:09"
        );
        assert_eq!(
            strftime_at("%d %b %Y, %A %a %B %j %y %e%%", t).unwrap(),
            "29 Feb 2024, Thursday Thu February 060 24 29%"
        );
        assert_eq!(strftime_at("%Y-%m-%d", 0).unwrap(), "1970-01-01");
        assert_eq!(strftime_at("%j", 0).unwrap(), "001");
        assert!(strftime_at("%Q", 0).is_err());
    }

    #[test]
    fn tojson_writes_as_pythons_json_dumps() {
        let v = Value::from_serialize(serde_json::json!({"b": [1, 2.5, "x<y & 'z'"], "a": null}));
        let none = Kwargs::from_iter(std::iter::empty::<(&str, Value)>());
        // Keys in the order given, as Python's dicts keep them.
        assert_eq!(
            tojson(&v, None, none).unwrap().to_string(),
            r#"{"b": [1, 2.5, "x<y & 'z'"], "a": null}"#
        );
        let two = Kwargs::from_iter([("indent", Value::from(2))]);
        assert_eq!(
            tojson(&Value::from_serialize([1]), None, two)
                .unwrap()
                .to_string(),
            "[\n  1\n]"
        );
    }
}
