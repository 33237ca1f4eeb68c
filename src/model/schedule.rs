//! Trigger schedules: 5-field crontab expressions (Vixie cron semantics),
//! `@daily`-style macros, and plain durations (`15m`, `1h30m`).
//!
//! The `cron` crate parses a 6/7-field dialect with seconds first, numbers
//! days of the week 1 = Sunday, and ANDs day-of-month with day-of-week. Users
//! write crontab, where 0 and 7 are Sunday and a schedule with both day fields
//! restricted fires when *either* matches. So npc parses crontab itself into
//! explicit value sets, then hands the `cron` crate only lists it cannot
//! misread, splitting a both-days-restricted schedule into two and taking the
//! earlier fire time.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, TimeZone};
use serde::{Serialize, Serializer};

/// Shortest interval a duration schedule may have.
pub const MIN_INTERVAL_SECS: u64 = 1;
/// Longest interval a duration schedule may have (one year).
pub const MAX_INTERVAL_SECS: u64 = 366 * 24 * 3600;

/// A validated schedule.
#[derive(Debug, Clone)]
pub enum Schedule {
    Cron(CronExpr),
    Every { seconds: u64, source: String },
}

impl PartialEq for Schedule {
    /// Two schedules are equal when they fire at the same times, however
    /// they are spelled.
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Schedule::Cron(a), Schedule::Cron(b)) => a.fields == b.fields,
            (Schedule::Every { seconds: a, .. }, Schedule::Every { seconds: b, .. }) => a == b,
            _ => false,
        }
    }
}

impl std::hash::Hash for Schedule {
    /// Consistent with `PartialEq`: the spelling does not count.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        match self {
            Schedule::Cron(c) => {
                0u8.hash(state);
                c.fields.hash(state);
            }
            Schedule::Every { seconds, .. } => {
                1u8.hash(state);
                seconds.hash(state);
            }
        }
    }
}

impl Serialize for Schedule {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Schedule::Cron(c) => f.write_str(&c.source),
            Schedule::Every { source, .. } => write!(f, "every {source}"),
        }
    }
}

/// A crontab expression, expanded to the set of values of each field.
#[derive(Debug, Clone)]
pub struct CronExpr {
    source: String,
    fields: CronFields,
    /// The `cron` crate schedules, built once on first use (building them
    /// parses text: per call, it cost more than the search itself).
    compiled: std::sync::OnceLock<Vec<cron::Schedule>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct CronFields {
    minutes: u64, // bits 0..=59
    hours: u32,   // bits 0..=23
    days: u32,    // bits 1..=31
    months: u16,  // bits 1..=12
    weekdays: u8, // bits 0..=6, 0 = Sunday
    /// Both day fields restricted (neither starts with `*`): a day matches
    /// when either does. Otherwise both must match.
    either_day: bool,
}

const MONTH_NAMES: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const DAY_NAMES: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

/// Why a schedule did not parse; the message is user-facing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleError(pub String);

impl fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for Schedule {
    type Err = ScheduleError;

    /// A crontab expression, a macro, or a duration.
    fn from_str(s: &str) -> Result<Self, ScheduleError> {
        let s = s.trim();
        if s.starts_with(|c: char| c.is_ascii_digit()) && !s.contains(char::is_whitespace) {
            let seconds = parse_duration(s)?;
            if !(MIN_INTERVAL_SECS..=MAX_INTERVAL_SECS).contains(&seconds) {
                return Err(ScheduleError(format!(
                    "interval `{s}` is out of range ({MIN_INTERVAL_SECS}s to 366d)"
                )));
            }
            return Ok(Schedule::Every {
                seconds,
                source: s.to_string(),
            });
        }
        let expanded = match s {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            m if m.starts_with('@') => {
                return Err(ScheduleError(format!(
                    "unknown macro `{m}`; use @yearly, @monthly, @weekly, @daily or @hourly"
                )));
            }
            other => other,
        };
        let parts: Vec<&str> = expanded.split_whitespace().collect();
        if parts.len() != 5 {
            return Err(ScheduleError(format!(
                "expected 5 fields (minute hour day-of-month month day-of-week), found {}",
                parts.len()
            )));
        }
        let minutes = field(parts[0], "minute", 0, 59, &[])?;
        let hours = field(parts[1], "hour", 0, 23, &[])?;
        let days = field(parts[2], "day-of-month", 1, 31, &[])?;
        let months = field(parts[3], "month", 1, 12, &MONTH_NAMES)?;
        let mut weekdays = field(parts[4], "day-of-week", 0, 7, &DAY_NAMES)?;
        if weekdays & (1 << 7) != 0 {
            weekdays = (weekdays | 1) & !(1 << 7); // 7 is Sunday too
        }
        Ok(Schedule::Cron(CronExpr {
            source: s.to_string(),
            fields: CronFields {
                minutes,
                hours: hours as u32,
                days: days as u32,
                months: months as u16,
                weekdays: weekdays as u8,
                either_day: !parts[2].starts_with('*') && !parts[4].starts_with('*'),
            },
            compiled: std::sync::OnceLock::new(),
        }))
    }
}

/// Expand one crontab field (`*`, `a`, `a-b`, `*/n`, `a-b/n`, lists of
/// those, names) into a bitset of the values it allows.
fn field(text: &str, what: &str, min: u32, max: u32, names: &[&str]) -> Result<u64, ScheduleError> {
    let value = |t: &str| -> Result<u32, ScheduleError> {
        let lower = t.to_ascii_lowercase();
        if let Some(i) = names.iter().position(|n| *n == lower) {
            // Month names count from 1, day names from 0.
            return Ok(i as u32 + min.min(1).max(if names.len() == 12 { 1 } else { 0 }));
        }
        let v: u32 = t
            .parse()
            .map_err(|_| ScheduleError(format!("`{t}` is not a valid {what}")))?;
        if v < min || v > max {
            return Err(ScheduleError(format!(
                "{what} `{v}` is out of range {min}-{max}"
            )));
        }
        Ok(v)
    };
    let mut bits = 0u64;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => {
                let step: u32 = s.parse().map_err(|_| {
                    ScheduleError(format!("step `{s}` in the {what} field is not a number"))
                })?;
                if step == 0 || step > max {
                    return Err(ScheduleError(format!(
                        "step `{step}` in the {what} field is out of range 1-{max}"
                    )));
                }
                (r, step)
            }
            None => (part, 1),
        };
        let (lo, hi) = if range == "*" {
            (min, if names.len() == 7 { 6 } else { max })
        } else if let Some((a, b)) = range.split_once('-') {
            let (a, b) = (value(a)?, value(b)?);
            if a > b {
                return Err(ScheduleError(format!(
                    "range `{range}` in the {what} field runs backwards"
                )));
            }
            (a, b)
        } else if part.contains('/') {
            (value(range)?, max)
        } else {
            let v = value(range)?;
            (v, v)
        };
        let mut v = lo;
        while v <= hi {
            bits |= 1 << v;
            v += step;
        }
    }
    if text.is_empty() || bits == 0 {
        return Err(ScheduleError(format!("the {what} field is empty")));
    }
    Ok(bits)
}

/// `15m`, `1h30m`, `90s`, `2d`: a sum of number+unit pairs, in seconds.
pub fn parse_duration(s: &str) -> Result<u64, ScheduleError> {
    let bad = || {
        ScheduleError(format!(
            "`{s}` is not a duration; write e.g. `30s`, `15m`, `1h30m` or `1d`"
        ))
    };
    let mut total: u64 = 0;
    let mut rest = s;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        if digits == 0 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let factor = match &rest[..unit_len] {
            "s" => 1,
            "m" => 60,
            "h" => 3600,
            "d" => 86_400,
            _ => return Err(bad()),
        };
        total = n
            .checked_mul(factor)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(bad)?;
        rest = &rest[unit_len..];
    }
    Ok(total)
}

fn list(bits: u64, lo: u32, hi: u32, map: impl Fn(u32) -> u32) -> String {
    (lo..=hi)
        .filter(|v| bits & (1 << v) != 0)
        .map(|v| map(v).to_string())
        .collect::<Vec<_>>()
        .join(",")
}

impl CronExpr {
    /// The expression as the user wrote it.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the expression sits in the corner where cron dialects
    /// disagree: a `*/n` day field next to a restricted other day field.
    /// Vixie cron and cronie (and npc) AND the two day fields there, since
    /// one starts with `*`; croniter (seed 000's library) ORs them.
    pub fn has_star_step_day_corner(&self) -> bool {
        let parts: Vec<&str> = self.source.split_whitespace().collect();
        let [_, _, dom, _, dow] = parts.as_slice() else {
            return false;
        };
        let star_step = |f: &str| f.starts_with("*/");
        let restricted = |f: &str| !f.starts_with('*');
        (star_step(dom) && restricted(dow)) || (star_step(dow) && restricted(dom))
    }

    /// The `cron` crate schedules whose earliest fire time is this
    /// expression's next fire time.
    fn cron_schedules(&self) -> &[cron::Schedule] {
        self.compiled.get_or_init(|| self.compile())
    }

    fn compile(&self) -> Vec<cron::Schedule> {
        let f = &self.fields;
        let base = format!(
            "0 {} {}",
            list(f.minutes, 0, 59, |v| v),
            list(f.hours as u64, 0, 23, |v| v)
        );
        let months = list(f.months as u64, 1, 12, |v| v);
        let days = list(f.days as u64, 1, 31, |v| v);
        // cron crate: 1 = Sunday … 7 = Saturday.
        let weekdays = list(f.weekdays as u64, 0, 6, |v| v + 1);
        let specs = if !f.either_day {
            // Vixie cron ANDs the day fields when either starts with `*`
            // (even `*/3`), as the `cron` crate always does.
            vec![format!("{base} {days} {months} {weekdays}")]
        } else {
            // Both restricted: either may match.
            vec![
                format!("{base} {days} {months} *"),
                format!("{base} * {months} {weekdays}"),
            ]
        };
        specs
            .iter()
            .filter_map(|s| cron::Schedule::from_str(s).ok())
            .collect()
    }

    /// Whether the expression fires at minute `t` (Vixie semantics). The
    /// reference the translation is tested against.
    pub fn matches<Tz: TimeZone>(&self, t: &DateTime<Tz>) -> bool {
        use chrono::{Datelike, Timelike};
        let f = &self.fields;
        let dom = f.days & (1 << t.day()) != 0;
        let dow = f.weekdays & (1 << t.weekday().num_days_from_sunday()) != 0;
        let day_ok = if f.either_day { dom || dow } else { dom && dow };
        t.second() == 0
            && f.minutes & (1 << t.minute()) != 0
            && f.hours & (1 << t.hour()) != 0
            && f.months & (1 << t.month()) != 0
            && day_ok
    }
}

impl Schedule {
    /// The first fire time strictly after `after`.
    pub fn next_after<Tz: TimeZone>(&self, after: &DateTime<Tz>) -> Option<DateTime<Tz>> {
        match self {
            Schedule::Every { seconds, .. } => {
                Some(after.clone() + chrono::Duration::seconds(i64::try_from(*seconds).ok()?))
            }
            Schedule::Cron(expr) => expr
                .cron_schedules()
                .iter()
                .filter_map(|s| s.after(after).next())
                .min(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Duration, Utc};

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn next(expr: &str, after: &str) -> String {
        let s: Schedule = expr.parse().unwrap();
        s.next_after(&at(after)).unwrap().to_rfc3339()
    }

    #[test]
    fn weekday_numbers_follow_crontab() {
        // 2026-11-29 is a Sunday.
        assert_eq!(
            next("0 9 * * 1", "2026-11-29T00:00:00Z"),
            "2026-11-30T09:00:00+00:00"
        );
        assert_eq!(
            next("0 9 * * 0", "2026-11-29T10:00:00Z"),
            "2026-12-06T09:00:00+00:00"
        );
        assert_eq!(
            next("0 9 * * 7", "2026-11-29T10:00:00Z"),
            "2026-12-06T09:00:00+00:00"
        );
        assert_eq!(
            next("30 8 * * mon-fri", "2026-12-04T09:00:00Z"),
            "2026-12-07T08:30:00+00:00"
        );
        assert_eq!(
            next("0 0 * * 5-7", "2026-11-30T00:00:00Z"),
            "2026-12-04T00:00:00+00:00"
        );
    }

    #[test]
    fn both_day_fields_restricted_means_either() {
        // The 1st of the month OR any Friday: after Sun 29 Nov comes Tue 1 Dec.
        assert_eq!(
            next("0 0 1 * 5", "2026-11-29T00:00:00Z"),
            "2026-12-01T00:00:00+00:00"
        );
        // …and after that Friday 4 Dec.
        assert_eq!(
            next("0 0 1 * 5", "2026-12-01T00:00:00Z"),
            "2026-12-04T00:00:00+00:00"
        );
    }

    #[test]
    fn macros_and_steps() {
        assert_eq!(
            next("@daily", "2026-11-29T10:00:00Z"),
            "2026-11-30T00:00:00+00:00"
        );
        assert_eq!(
            next("*/15 * * * *", "2026-11-29T10:01:00Z"),
            "2026-11-29T10:15:00+00:00"
        );
        assert_eq!(
            next("0 0 1 jan *", "2026-11-29T10:01:00Z"),
            "2027-01-01T00:00:00+00:00"
        );
    }

    #[test]
    fn the_star_step_day_corner_is_recognised() {
        let corner = |e: &str| match e.parse::<Schedule>().unwrap() {
            Schedule::Cron(c) => c.has_star_step_day_corner(),
            Schedule::Every { .. } => false,
        };
        assert!(corner("0 0 */2 * 1"));
        assert!(corner("0 0 1,15 * */2"));
        assert!(!corner("0 0 */2 * *"));
        assert!(!corner("0 0 1 * 1"));
        assert!(!corner("*/5 * * * *"));
        assert!(!corner("@daily"));
        // npc ANDs them (Vixie): an odd day of the month that is also a
        // Monday (croniter would fire on Tue 1 Dec, an odd day).
        assert_eq!(
            next("0 0 */2 * 1", "2026-11-29T00:00:00Z"),
            "2026-12-07T00:00:00+00:00"
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1h30m").unwrap(), 5400);
        assert_eq!(parse_duration("15m").unwrap(), 900);
        assert!(parse_duration("15x").is_err());
        assert!(parse_duration("m").is_err());
        assert!("0s".parse::<Schedule>().is_err());
        assert!("99999999999999999999d".parse::<Schedule>().is_err());
        assert_eq!(
            "15m".parse::<Schedule>().unwrap(),
            "900s".parse::<Schedule>().unwrap()
        );
    }

    #[test]
    fn bad_expressions_are_explained() {
        for (bad, needle) in [
            ("* * * *", "5 fields"),
            ("60 * * * *", "out of range"),
            ("* * 0 * *", "out of range"),
            ("5-1 * * * *", "backwards"),
            ("*/0 * * * *", "step"),
            ("* * * foo *", "not a valid month"),
            ("@reboot", "unknown macro"),
        ] {
            let err = bad.parse::<Schedule>().unwrap_err();
            assert!(err.0.contains(needle), "{bad}: {err}");
        }
    }

    /// Compare the `cron`-crate translation with a brute-force minute walk
    /// over Vixie semantics, for many expressions and start times.
    #[test]
    fn translation_agrees_with_reference_matcher() {
        let exprs = [
            "0 9 * * 1-5",
            "*/7 */5 * * *",
            "15 2 1,15 * 3",
            "0 0 29 2 *",
            "0 12 * 6-8 sat,sun",
            "5 4 */3 * 0",
            "0 0 13 * 5",
            "1-10/3 22 * * 7",
            "0 0 31 * *",
            "59 23 * 12 *",
        ];
        let mut start = at("2026-01-01T00:00:00Z");
        for (i, expr) in exprs.iter().enumerate() {
            let Schedule::Cron(c) = expr.parse::<Schedule>().unwrap() else {
                panic!()
            };
            let s = Schedule::Cron(c.clone());
            for _ in 0..5 {
                let got = s.next_after(&start).unwrap();
                let mut t = start + Duration::minutes(1)
                    - Duration::seconds(i64::from(chrono::Timelike::second(&start)));
                while !c.matches(&t) {
                    t += Duration::minutes(1);
                }
                assert_eq!(got, t, "{expr} after {start}");
                start = got;
            }
            start = at("2026-03-01T00:00:00Z") + Duration::days(i as i64 * 37);
        }
    }
}
