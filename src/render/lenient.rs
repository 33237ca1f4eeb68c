//! The trigger payload in templates, looked up leniently: seed 000 renders
//! `{a.b.c}` paths into a webhook's payload and prints a missing key as an
//! empty string. npc keeps that for the payload only — `{{ trigger.body.a.b.c }}`
//! is empty (and false in an `if`) when any step is missing — while every
//! other lookup in a template stays strict (an undefined value is an error
//! naming the template and line).

use std::fmt;
use std::sync::Arc;

use minijinja::Value;
use minijinja::value::{Enumerator, Object, ObjectRepr};

/// A JSON value whose missing keys and indexes are an empty [`Lenient`].
#[derive(Debug)]
pub struct Lenient(pub serde_json::Value);

/// `value` as a template value: containers and null stay lenient, scalars
/// become plain values (so filters and comparisons work on them).
pub fn lenient(value: serde_json::Value) -> Value {
    match value {
        serde_json::Value::Object(_) | serde_json::Value::Array(_) | serde_json::Value::Null => {
            Value::from_object(Lenient(value))
        }
        scalar => Value::from(minijinja::value::Serde(&scalar)),
    }
}

impl Object for Lenient {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        match &self.0 {
            serde_json::Value::Array(_) => ObjectRepr::Seq,
            serde_json::Value::Object(_) => ObjectRepr::Map,
            _ => ObjectRepr::Plain,
        }
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let found = match &self.0 {
            serde_json::Value::Object(map) => key.as_str().and_then(|k| map.get(k)),
            serde_json::Value::Array(items) => key
                .as_i64()
                .and_then(|i| usize::try_from(i).ok())
                .and_then(|i| items.get(i)),
            _ => None,
        };
        Some(lenient(found.cloned().unwrap_or(serde_json::Value::Null)))
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        match &self.0 {
            serde_json::Value::Object(map) => {
                Enumerator::Values(map.keys().map(|k| Value::from(k.as_str())).collect())
            }
            serde_json::Value::Array(items) => {
                Enumerator::Values(items.iter().cloned().map(lenient).collect())
            }
            _ => Enumerator::Empty,
        }
    }

    fn is_true(self: &Arc<Self>) -> bool {
        match &self.0 {
            serde_json::Value::Object(map) => !map.is_empty(),
            serde_json::Value::Array(items) => !items.is_empty(),
            _ => false,
        }
    }

    fn render(self: &Arc<Self>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            serde_json::Value::Null => Ok(()),
            other => write!(f, "{other}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(template: &str, payload: serde_json::Value) -> Result<String, minijinja::Error> {
        let env = crate::model::template::environment();
        let t = env.template_from_str(template)?;
        t.render(minijinja::context! { trigger => lenient(payload), vars => Value::from(()) })
    }

    #[test]
    fn missing_payload_keys_are_empty_and_false_everything_else_stays_strict() {
        let p = serde_json::json!({"body": {"a": {"b": {"c": "deep"}}, "list": [1, 2]}});
        assert_eq!(
            render("{{ trigger.body.a.b.c }}", p.clone()).unwrap(),
            "deep"
        );
        assert_eq!(
            render("[{{ trigger.body.x.y.z }}]", p.clone()).unwrap(),
            "[]"
        );
        assert_eq!(
            render("{{ trigger.body.list[1] }}", p.clone()).unwrap(),
            "2"
        );
        assert_eq!(
            render("{{ trigger.body.list[9].q }}|", p.clone()).unwrap(),
            "|"
        );
        assert_eq!(
            render(
                "{% if trigger.body.nope %}y{% else %}n{% endif %}",
                p.clone()
            )
            .unwrap(),
            "n"
        );
        assert_eq!(
            render("{% for k in trigger.body %}{{ k }},{% endfor %}", p.clone()).unwrap(),
            "a,list,"
        );
        assert!(
            render("{{ vars.missing.x }}", p).is_err(),
            "strict outside the payload"
        );
    }
}
