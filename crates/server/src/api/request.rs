//! A request body as it arrives: read as JSON (`json_body`), every top-level field checked by
//! name (`check_fields`, shared by every API: a field is accepted exactly when a struct reads it,
//! `field_names`), then read once by structs side by side (`Body`): the engine's
//! `SamplingSettings`, `Shared` and `TopLevelSpec` (the settings every API names alike), then the
//! API's own fields. For the chat and text completions that is `WireRequest`; `chat` reads it into
//! the common request that `validate` checks.

use super::error::ApiError;
use super::validate::Settings;
use super::Kind;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use drafting::SpecOverrides;
use engine::{GenerationSettings, SamplingSettings};
use serde::de::{self, DeserializeOwned, DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use std::fmt;

/// Message content: a string or a list of text parts.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize)]
pub(super) struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct ChatMessage {
    pub role: String,
    pub content: Option<Content>,
    /// An assistant turn's calls: `{"id", "type": "function", "function": {"name", "arguments":
    /// <JSON text>}}`.
    pub tool_calls: Option<Vec<Value>>,
    /// A `tool` turn: the call it answers.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
    /// An assistant turn's reasoning, as vLLM and llama.cpp return it (`reasoning` in newer
    /// vLLM), for templates that show it.
    #[serde(alias = "reasoning")]
    pub reasoning_content: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Default)]
pub(super) struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// The settings every API reads under the same names besides the sampling settings
/// (`engine::SamplingSettings`) and the speculation settings given at the top level
/// (`TopLevelSpec`), both read beside it: OpenAI's, and vLLM's `speculative_config`.
#[derive(Deserialize)]
pub(super) struct Shared {
    /// The served model's name; absent or null means the served model (one model per server).
    pub model: Option<String>,
    #[serde(default)]
    pub stream: bool,
    pub speculative_config: Option<SpecOverrides>,
}

/// The fields of `SpecOverrides` a body may give at its top level (vLLM's and Hugging Face's
/// request fields); the others only inside `speculative_config`.
const TOP_LEVEL_SPEC: &[&str] = &[
    "num_speculative_tokens",
    "prompt_lookup_max",
    "prompt_lookup_min",
];

/// The speculation settings a body gives at its top level: a `SpecOverrides` read from the
/// fields `TOP_LEVEL_SPEC` names (each read as `SpecOverrides` reads it, a wrong value an error
/// at its own path), the rest of the body passed over.
pub(super) struct TopLevelSpec(pub SpecOverrides);

impl<'de> Deserialize<'de> for TopLevelSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;

        impl<'de> Visitor<'de> for Fields {
            type Value = TopLevelSpec;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TopLevelSpec, A::Error> {
                let mut given = serde_json::Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    if TOP_LEVEL_SPEC.contains(&key.as_str()) {
                        let value = map.next_value_seed(OneSpecField(&key))?;
                        given.insert(key, value);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                spec_overrides(given).map(TopLevelSpec)
            }
        }

        d.deserialize_struct("TopLevelSpec", TOP_LEVEL_SPEC, Fields)
    }
}

/// The value of one top-level speculation field, checked by reading it as `SpecOverrides` does.
struct OneSpecField<'a>(&'a str);

impl<'de> DeserializeSeed<'de> for OneSpecField<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        let value = Value::deserialize(d)?;
        spec_overrides::<D::Error>(serde_json::Map::from_iter([(
            self.0.to_string(),
            value.clone(),
        )]))?;
        Ok(value)
    }
}

fn spec_overrides<E: de::Error>(
    fields: serde_json::Map<String, Value>,
) -> Result<SpecOverrides, E> {
    SpecOverrides::deserialize(Value::Object(fields)).map_err(E::custom)
}

/// Settings holding those every API reads (the rest default, for the API's reader to fill).
pub(super) fn settings(
    sampling: &SamplingSettings,
    shared: &Shared,
    speculation: &TopLevelSpec,
) -> Settings {
    Settings {
        model: shared.model.clone(),
        generation: GenerationSettings {
            sampling: sampling.clone(),
            speculative_config: shared.speculative_config.clone(),
            speculation: speculation.0.clone(),
            ..Default::default()
        },
        stream: shared.stream,
        ..Default::default()
    }
}

/// The fields both completion endpoints read besides the settings every API reads.
#[derive(Deserialize)]
pub(super) struct Completion {
    pub max_tokens: Option<usize>,
    pub max_completion_tokens: Option<usize>,
    pub stop: Option<Stop>,
    pub n: Option<usize>,
    pub stream_options: Option<StreamOptions>,
    /// Chat: true or false (with `top_logprobs`); text completions: the number of alternatives.
    pub logprobs: Option<Value>,
    pub top_logprobs: Option<usize>,
    /// `{"type": "text" | "json_object"}` or `{"type": "json_schema", "json_schema": {"schema":
    /// ..., "name": ..., "strict": ...}}`.
    pub response_format: Option<Value>,
    /// llama.cpp's extensions: a JSON Schema, or a grammar in GBNF.
    pub json_schema: Option<Value>,
    pub grammar: Option<String>,
}

/// The fields of chat completions only.
#[derive(Deserialize)]
pub(super) struct ChatFields {
    /// Required; `None` only when absent (a null is a wrong type).
    #[serde(default, deserialize_with = "present")]
    pub messages: Option<Vec<ChatMessage>>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    /// vLLM's settings for where the prompt ends (see `PromptEnd`).
    pub add_generation_prompt: Option<bool>,
    pub continue_final_message: Option<bool>,
    /// `low`, `medium` or `high`, for templates that take it (gpt-oss's).
    pub reasoning_effort: Option<String>,
}

/// The fields of text completions only.
#[derive(Deserialize)]
pub(super) struct TextFields {
    /// Required; `None` only when absent (a null is refused as not a string).
    #[serde(default, deserialize_with = "present")]
    pub prompt: Option<Value>,
    /// The text after the completion: with it, the model fills in the middle between `prompt`
    /// and `suffix` (`infill`).
    pub suffix: Option<String>,
}

/// A chat or text completion as the client sent it.
pub(super) struct WireRequest {
    pub sampling: SamplingSettings,
    pub shared: Shared,
    pub speculation: TopLevelSpec,
    pub completion: Completion,
    pub prompt: Prompt,
}

/// The fields of one endpoint only.
pub(super) enum Prompt {
    Chat(ChatFields),
    Text(TextFields),
}

/// A required field, read even when null: absent is `None` (through `default`).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// A required field that was absent, refused as serde words it.
pub(super) fn missing(field: &str) -> ApiError {
    ApiError::bad_request(format!("invalid request: missing field `{field}`"), None)
}

/// OpenAI fields accepted only with the value that changes nothing (what pld does anyway);
/// any other value is refused rather than silently ignored.
pub(super) fn neutral(field: &str, v: &Value) -> Option<bool> {
    let empty = |v: &Value| {
        v.is_null()
            || v.as_object().is_some_and(|o| o.is_empty())
            || v.as_array().is_some_and(|a| a.is_empty())
    };
    Some(match field {
        "user" => v.is_string() || v.is_null(),
        "frequency_penalty" | "presence_penalty" => v.is_null() || v.as_f64() == Some(0.0),
        "logit_bias" | "metadata" => empty(v),
        "parallel_tool_calls" | "store" => v.is_null() || v.is_boolean(),
        "echo" => v.is_null() || v.as_bool() == Some(false),
        "best_of" => v.is_null() || v.as_u64() == Some(1),
        _ => return None,
    })
}

/// Checks every top-level field of a request: fields pld reads (`known`) pass; fields whose value
/// pld cannot honour (`neutral` says which values change nothing) and unknown fields are a 400
/// naming the field, unless the server is lenient, in which case they are logged and dropped.
pub(super) fn check_fields(
    body: &mut Value,
    known: &[&str],
    neutral: fn(&str, &Value) -> Option<bool>,
    lenient: bool,
) -> Result<(), ApiError> {
    let Some(object) = body.as_object_mut() else {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
            None,
        ));
    };
    let mut ignored = Vec::new();
    for (name, value) in object.iter() {
        if known.contains(&name.as_str()) {
            continue;
        }
        let problem = match neutral(name, value) {
            Some(true) => continue,
            Some(false) => format!("'{name}' is not supported with this value ({value})"),
            None => format!("Unrecognized request argument supplied: {name}"),
        };
        if !lenient {
            return Err(ApiError::bad_request(problem, Some(name)));
        }
        tracing::warn!(field = %name, "ignored: {problem}");
        ignored.push(name.clone());
    }
    for name in ignored {
        object.remove(&name);
    }
    Ok(())
}

/// A body as JSON; unreadable (too large: 413) or not JSON is an error.
pub(super) fn json_body(body: Result<Bytes, BytesRejection>) -> Result<Value, ApiError> {
    let body = body.map_err(|e| {
        let message = if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            "request body is too large".into()
        } else {
            format!("cannot read the request body: {e}")
        };
        ApiError::new(e.status(), "invalid_request_error", message)
    })?;
    serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}"), None))
}

/// The fields a struct reads, as serde names them (renames applied), asked of the struct by a
/// deserializer that records them and reads nothing. Every API's list of accepted fields is made
/// of these, so that a field is accepted exactly when a struct reads it.
///
/// # Panics
/// When `T` is not a plain struct (a `#[serde(flatten)]` field hides the names).
pub(super) fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
    match T::deserialize(names::Recorder) {
        Err(names::Recorded(Some(fields))) => fields,
        _ => panic!(
            "{} does not name its fields to serde",
            std::any::type_name::<T>()
        ),
    }
}

mod names {
    use serde::de::{Deserializer, Visitor};
    use std::fmt;

    /// A deserializer that answers every request with an error, carrying the field names when
    /// asked for a struct.
    pub(super) struct Recorder;

    #[derive(Debug)]
    pub(super) struct Recorded(pub Option<&'static [&'static str]>);

    impl fmt::Display for Recorded {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("field names recorded")
        }
    }

    impl std::error::Error for Recorded {}

    impl serde::de::Error for Recorded {
        fn custom<T: fmt::Display>(_: T) -> Self {
            Recorded(None)
        }
    }

    impl<'de> Deserializer<'de> for Recorder {
        type Error = Recorded;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Recorded> {
            Err(Recorded(None))
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _visitor: V,
        ) -> Result<V::Value, Recorded> {
            Err(Recorded(Some(fields)))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }
}

/// Structs that read one body side by side, each its own fields. None flattens another
/// (`#[serde(flatten)]`): serde reads a flattened struct from a buffer, after the rest, and the
/// error of a field of the wrong type then loses its path, which the 400 names.
pub(super) trait Body: Sized {
    /// Every field the structs read.
    fn fields() -> Vec<&'static str>;

    /// The structs read from `body`; of their errors, the one at the body's earliest field: the
    /// error one struct reading every field would have met first.
    fn read(body: &Value) -> Result<Self, ApiError>;
}

macro_rules! side_by_side {
    ($($t:ident),+) => {
        impl<$($t: DeserializeOwned),+> Body for ($($t,)+) {
            fn fields() -> Vec<&'static str> {
                [$(field_names::<$t>()),+].concat()
            }

            #[allow(non_snake_case)]
            fn read(body: &Value) -> Result<Self, ApiError> {
                match ($(read_one::<$t>(body),)+) {
                    ($(Ok($t),)+) => Ok(($($t,)+)),
                    ($($t,)+) => Err(earliest([$($t.err()),+])),
                }
            }
        }
    };
}

side_by_side!(A);
side_by_side!(A, B);
side_by_side!(A, B, C);
side_by_side!(A, B, C, D);
side_by_side!(A, B, C, D, E);

/// One struct read from a checked body, a field of the wrong type a 400 naming it by its path;
/// the error comes with the position of its field in the body.
fn read_one<T: DeserializeOwned>(body: &Value) -> Result<T, (usize, ApiError)> {
    serde_path_to_error::deserialize(body).map_err(|e| {
        let at = match e.path().iter().next() {
            Some(serde_path_to_error::Segment::Map { key }) => body
                .as_object()
                .and_then(|o| o.keys().position(|k| k == key)),
            _ => None,
        };
        let path = e.path().to_string();
        let param = (path != ".").then_some(path);
        let error = ApiError::bad_request(
            format!("invalid request: {}", e.into_inner()),
            param.as_deref(),
        );
        (at.unwrap_or(usize::MAX), error)
    })
}

fn earliest<const N: usize>(errors: [Option<(usize, ApiError)>; N]) -> ApiError {
    errors
        .into_iter()
        .flatten()
        .min_by_key(|(at, _)| *at)
        .map(|(_, e)| e)
        .expect("one of the reads failed")
}

/// A body checked against `B`'s fields (less those `neutral` checks first, `checked`) and read.
pub(super) fn read_checked<B: Body>(
    mut body: Value,
    checked: &[&str],
    neutral: fn(&str, &Value) -> Option<bool>,
    lenient: bool,
) -> Result<B, ApiError> {
    check_fields(&mut body, &accepted::<B>(checked), neutral, lenient)?;
    B::read(&body)
}

/// The fields of `B` accepted by name: those it reads, less `checked`.
fn accepted<B: Body>(checked: &[&str]) -> Vec<&'static str> {
    B::fields()
        .into_iter()
        .filter(|f| !checked.contains(f))
        .collect()
}

/// Reads a chat or text completion's body into its fields, turning every way it can be wrong
/// into a 400 (or 413): unreadable, not JSON, a field refused by `check_fields`, a field of the
/// wrong type (named by its path).
pub(super) fn parse(
    body: Result<Bytes, BytesRejection>,
    kind: Kind,
    lenient: bool,
) -> Result<WireRequest, ApiError> {
    let value = json_body(body)?;
    match kind {
        Kind::Chat => read_wire(value, lenient, Prompt::Chat),
        Kind::Text => read_wire(value, lenient, Prompt::Text),
    }
}

/// A completion's body read with the endpoint's own fields `F`.
fn read_wire<F: DeserializeOwned>(
    value: Value,
    lenient: bool,
    prompt: fn(F) -> Prompt,
) -> Result<WireRequest, ApiError> {
    let (sampling, shared, speculation, completion, fields) =
        read_checked(value, &[], neutral, lenient)?;
    Ok(WireRequest {
        sampling,
        shared,
        speculation,
        completion,
        prompt: prompt(fields),
    })
}

/// Checks that a body `B` accepts exactly the fields it reads: each read by one struct (a setting
/// written once), every one accepted (by name, or by value: `value_checked`, which `neutral`
/// answers for), the name accepted the name read (a value of the wrong type is refused naming
/// it), and a field no struct reads refused.
#[cfg(test)]
pub(super) fn assert_reads_what_it_accepts<B: Body>(
    value_checked: &[&str],
    neutral: fn(&str, &Value) -> Option<bool>,
) {
    let read = B::fields();
    let mut once = read.clone();
    once.sort_unstable();
    once.dedup();
    assert_eq!(once.len(), read.len(), "a field read twice: {read:?}");
    for field in value_checked {
        assert!(read.contains(field), "{field} is not read");
        assert!(
            neutral(field, &Value::Null).is_some(),
            "{field} is not checked"
        );
    }
    for field in &read {
        let mut body = serde_json::json!({ *field: null });
        let known = accepted::<B>(value_checked);
        assert!(
            check_fields(&mut body, &known, neutral, false).is_ok(),
            "{field} refused"
        );
        for probe in [serde_json::json!(true), serde_json::json!("probe")] {
            let mut body = serde_json::json!({ *field: probe });
            if let Err(e) = read_checked::<B>(body.take(), value_checked, neutral, false) {
                let param = e.param.unwrap_or_default();
                assert!(
                    param.starts_with(field) || value_checked.contains(field),
                    "{field}: {}",
                    e.message
                );
            }
        }
    }
    let mut stray = serde_json::json!({"not_read": 1});
    let e = read_checked::<B>(stray.take(), value_checked, neutral, false).err();
    assert_eq!(e.and_then(|e| e.param).as_deref(), Some("not_read"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn completions_read_what_they_accept() {
        assert_reads_what_it_accepts::<(
            SamplingSettings,
            Shared,
            TopLevelSpec,
            Completion,
            ChatFields,
        )>(&[], neutral);
        assert_reads_what_it_accepts::<(
            SamplingSettings,
            Shared,
            TopLevelSpec,
            Completion,
            TextFields,
        )>(&[], neutral);
    }

    #[test]
    fn field_names_are_serde_names() {
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Renamed {
            #[serde(rename = "type")]
            kind: Option<String>,
            plain: Option<u32>,
        }
        assert_eq!(field_names::<Renamed>(), ["type", "plain"]);
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Flat {
            #[serde(flatten)]
            inner: Renamed,
        }
        assert!(std::panic::catch_unwind(field_names::<Flat>).is_err());
    }

    /// Of two fields of the wrong type read by different structs, the error names the first in
    /// the body, as one struct reading both would.
    #[test]
    fn the_earliest_wrong_field_is_named() {
        let body = serde_json::json!({"max_tokens": "x", "temperature": "y", "messages": []});
        let e = <(
            SamplingSettings,
            Shared,
            TopLevelSpec,
            Completion,
            ChatFields,
        )>::read(&body)
        .err()
        .unwrap();
        let first = body
            .as_object()
            .unwrap()
            .keys()
            .find(|k| *k != "messages")
            .cloned();
        assert_eq!(e.param, first);
    }

    /// JSON values whose object keys are mostly the request's own fields, so that the typed
    /// reading is reached with wrong types, nesting and values.
    fn request_like() -> impl Strategy<Value = Value> {
        let keys: Vec<&'static str> = <(
            SamplingSettings,
            Shared,
            TopLevelSpec,
            Completion,
            ChatFields,
        )>::fields()
        .into_iter()
        .chain([
            "messages",
            "prompt",
            "role",
            "content",
            "logit_bias",
            "tools",
            "x",
        ])
        .collect();
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
            "[a-z ]{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, move |inner| {
            let keys = keys.clone();
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::vec((proptest::sample::select(keys), inner), 0..6).prop_map(
                    |kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
                ),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Any body is read into a request or refused with a 400; nothing panics.
        #[test]
        fn any_body_is_read_or_refused(v in request_like(), chat in any::<bool>(), lenient in any::<bool>()) {
            let kind = if chat { Kind::Chat } else { Kind::Text };
            let bytes = Bytes::from(serde_json::to_vec(&v).unwrap());
            match parse(Ok(bytes), kind, lenient) {
                Ok(request) => {
                    let _ = super::super::chat::logprobs(&request.completion, kind);
                }
                Err(e) => prop_assert_eq!(e.status, StatusCode::BAD_REQUEST),
            }
        }

        #[test]
        fn any_bytes_are_read_or_refused(raw in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Err(e) = parse(Ok(Bytes::from(raw)), Kind::Chat, false) {
                prop_assert_eq!(e.status, StatusCode::BAD_REQUEST);
            }
        }
    }
}
