//! [`Text`]: a manifest string after `${VAR}` expansion, which remembers
//! whether any of it came from the environment. Secret text prints as
//! `<redacted>` in `Debug`, `Display` and `Serialize`, so it cannot leak into
//! logs, events, plans or rendered files by accident; code that must hand the
//! real value to a child process asks for it with [`Text::expose`].

use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::de::{TEXT_FIELDS, TEXT_NAME};

/// What secret text prints as.
pub const REDACTED: &str = "<redacted>";

/// An interpolated string value.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Text {
    value: String,
    secret: bool,
    /// The string as written in the manifest when it used `${…}`, so
    /// exporters can write an environment reference instead of the value.
    source: Option<String>,
    /// An interpolation failed (an unset variable, a malformed `${…}`): the
    /// value is a placeholder. The failure is already an error diagnostic,
    /// so such text never reaches a valid model; checks on the value skip it
    /// while the rest of its entry is still checked.
    unresolved: bool,
}

impl Text {
    /// Plain, non-secret text.
    pub fn plain(value: impl Into<String>) -> Self {
        Self {
            value: value.into(),
            secret: false,
            source: None,
            unresolved: false,
        }
    }

    /// Text that came from the environment.
    pub fn secret(value: impl Into<String>) -> Self {
        Self {
            value: value.into(),
            secret: true,
            source: None,
            unresolved: false,
        }
    }

    /// Text as written with `${…}` references, and what it expanded to.
    pub fn interpolated(source: impl Into<String>, value: impl Into<String>, secret: bool) -> Self {
        Self {
            value: value.into(),
            secret,
            source: Some(source.into()),
            unresolved: false,
        }
    }

    /// The string as written (`Bearer ${TOKEN}`) when it used
    /// interpolation; `None` for literal text.
    pub fn source(&self) -> Option<&str> {
        self.source.as_deref()
    }

    /// The real value, for the few places that must use it (a child's
    /// environment or arguments). Never log what this returns.
    pub fn expose(&self) -> &str {
        &self.value
    }

    pub fn is_secret(&self) -> bool {
        self.secret
    }

    /// Whether `${…}` expansion failed and the value is a placeholder
    /// (only while loading; a valid model has none).
    pub fn is_unresolved(&self) -> bool {
        self.unresolved
    }

    /// The value, or [`REDACTED`] when secret.
    pub fn shown(&self) -> &str {
        if self.secret { REDACTED } else { &self.value }
    }
}

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.shown(), f)
    }
}

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.shown())
    }
}

impl Serialize for Text {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.shown())
    }
}

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Text, E> {
                Ok(Text::plain(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Text, A::Error> {
                let mut text = Text::default();
                while let Some(key) = map.next_key::<&str>()? {
                    if key == TEXT_FIELDS[0] {
                        text.value = map.next_value()?;
                    } else if key == TEXT_FIELDS[1] {
                        text.secret = map.next_value()?;
                    } else if key == TEXT_FIELDS[3] {
                        text.unresolved = map.next_value()?;
                    } else {
                        text.source = Some(map.next_value()?);
                    }
                }
                Ok(text)
            }
        }
        d.deserialize_struct(TEXT_NAME, &TEXT_FIELDS, V)
    }
}

impl schemars::JsonSchema for Text {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Text".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "A string; `${VAR}` and `${VAR:-default}` expand from the environment, `$$` is a literal `$`."
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let t = Text::secret("hunter2");
        assert_eq!(format!("{t} {t:?}"), "<redacted> \"<redacted>\"");
        assert_eq!(serde_json::to_string(&t).unwrap(), "\"<redacted>\"");
        assert_eq!(t.expose(), "hunter2");
        assert_eq!(Text::plain("x").to_string(), "x");
    }
}
