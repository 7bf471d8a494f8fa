//! Structured output (`response_format`): constrained greedy output is valid JSON (matching the
//! schema when one is given), speculation leaves it token for token unchanged, drafts copied from
//! the prompt's text still land under the grammar, and a schema that does not compile is an error naming
//! `response_format`.

mod common;

use common::*;
use engine::{GenerationConfig, GenerationOutput, LoadedModel, Message, ResponseFormat};
use serde_json::{json, Value};

fn run(
    lm: &LoadedModel,
    prompt: &[u32],
    format: &ResponseFormat,
    k: usize,
    tree: bool,
) -> GenerationOutput {
    let mut config = GenerationConfig {
        max_new_tokens: 128,
        response_format: format.clone(),
        ..Default::default()
    };
    config.speculation.num_speculative_tokens = k;
    config.speculation.adaptive = false;
    if tree {
        config.speculation.method = drafting::SpecMethod::Tree;
    }
    engine::generate(
        &lm.model,
        &lm.tokenizer,
        prompt.to_vec(),
        config,
        4096,
        |_| {},
    )
    .unwrap()
}

fn chat(lm: &LoadedModel, text: &str) -> Vec<u32> {
    let prompt = lm.render_chat(&[Message::new("user", text)]).unwrap();
    lm.tokenizer.encode_prompt(&prompt).unwrap()
}

/// The first json_extraction row of the grounded workload: a document and a request to extract
/// fields from it as JSON.
fn extraction_prompt(lm: &LoadedModel) -> Vec<u32> {
    let text = std::fs::read_to_string(repo_dir().join("workloads/grounded-dev.jsonl")).unwrap();
    let row: Value = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["category"] == "json_extraction")
        .unwrap();
    chat(lm, row["turns"][0].as_str().unwrap())
}

/// A request whose answer copies a sentence of its text into a JSON string.
const QUOTE_REQUEST: &str = "Text: \"The Rhine flows from the Swiss Alps through Germany and the \
Netherlands before it reaches the North Sea near Rotterdam. It has carried barges, timber and wine \
for two thousand years. Today its banks are lined with castles and vineyards.\"\n\n\
Copy the first sentence of the text, word for word, into a JSON object with the key \"sentence\".";

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "skills": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 5}
        },
        "required": ["name", "age", "skills"],
        "additionalProperties": false
    })
}

#[test]
fn constrained_greedy_is_valid_json_and_speculation_exact() {
    for alias in ["smollm2-135m", "qwen-coder-0.5b"] {
        // f32 keys and values: with bf16's, SmolLM2's greedy extraction (case 1) repeats a
        // sentence until the length limit, a 135M model's path rather than the grammar's. What
        // this test checks is the grammar and the speculation; speculative equals plain on
        // every cache type in tiny_models and gemma3.
        let lm = model_caching(alias, engine::kv_cache::KvDtype::F32);
        let cases = [
            (
                chat(
                    &lm,
                    "Maria Lopez is 34 years old and knows Rust, Python and SQL. Give her as JSON.",
                ),
                ResponseFormat::JsonSchema {
                    schema: person_schema(),
                },
            ),
            (extraction_prompt(&lm), ResponseFormat::JsonObject),
            (
                chat(&lm, QUOTE_REQUEST),
                ResponseFormat::JsonSchema {
                    schema: json!({
                        "type": "object",
                        "properties": {"sentence": {"type": "string"}},
                        "required": ["sentence"],
                        "additionalProperties": false
                    }),
                },
            ),
        ];
        // The larger model only on the short case, with one speculative setting (time).
        let small = alias == "smollm2-135m";
        for (ci, (prompt, format)) in cases.iter().enumerate().take(if small { 3 } else { 1 }) {
            let plain = run(&lm, prompt, format, 0, false);
            assert_eq!(
                plain.finish_reason,
                engine::FinishReason::Stop,
                "{alias} case {ci}: the JSON did not finish: {}",
                plain.text
            );
            let v: Value = serde_json::from_str(plain.text.trim())
                .unwrap_or_else(|e| panic!("{alias} case {ci}: not JSON ({e}): {}", plain.text));
            assert!(v.is_object(), "{alias} case {ci}: {v}");
            let o = v.as_object().unwrap();
            if ci == 0 {
                assert!(o["name"].is_string() && o["age"].is_u64() && o["skills"].is_array());
                assert_eq!(o.len(), 3, "{alias}: no other keys: {v}");
            }
            if ci == 2 {
                let sentence = o["sentence"].as_str().unwrap_or("");
                assert!(sentence.starts_with("The Rhine flows"), "{alias}: {v}");
                assert_eq!(o.len(), 1, "{alias}: no other keys: {v}");
            }
            let settings: &[(usize, bool)] = if small {
                &[(4, false), (8, false), (8, true)]
            } else {
                &[(8, false)]
            };
            for &(k, tree) in settings {
                let spec = run(&lm, prompt, format, k, tree);
                assert_eq!(
                    plain.token_ids, spec.token_ids,
                    "{alias} case {ci} K={k} tree={tree}: speculation changed constrained output"
                );
                if ci == 2 {
                    // The answer copies a sentence of the text: drafts still land under the
                    // grammar.
                    assert!(
                        spec.stats.accepted_tokens > 0,
                        "{alias} K={k}: {:?}",
                        spec.stats
                    );
                }
            }
        }
    }
}

/// Sampling under a grammar: every seeded sample that finishes is a JSON object, with and
/// without speculation.
#[test]
fn constrained_sampling_gives_json() {
    let lm = model("smollm2-135m");
    let prompt = chat(&lm, "Describe the city of Paris as a JSON object.");
    for seed in 0..4u64 {
        for k in [0, 6] {
            let mut config = GenerationConfig {
                max_new_tokens: 200,
                seed: Some(seed),
                response_format: ResponseFormat::JsonObject,
                ..Default::default()
            };
            config.sampling.do_sample = true;
            config.sampling.temperature = 0.9;
            config.speculation.num_speculative_tokens = k;
            let out = engine::generate(
                &lm.model,
                &lm.tokenizer,
                prompt.clone(),
                config,
                4096,
                |_| {},
            )
            .unwrap();
            if out.finish_reason == engine::FinishReason::Stop {
                let v: Value = serde_json::from_str(out.text.trim())
                    .unwrap_or_else(|e| panic!("seed {seed} K={k}: not JSON ({e}): {}", out.text));
                assert!(v.is_object());
            } else {
                // Cut by max tokens: still a prefix of JSON, starting with the object.
                assert!(out.text.trim_start().starts_with('{'), "{}", out.text);
            }
        }
    }
}

#[test]
fn a_schema_that_does_not_compile_names_response_format() {
    let lm = model("smollm2-135m");
    let mut config = GenerationConfig {
        response_format: ResponseFormat::JsonSchema {
            schema: json!({"type": "object", "properties": {"a": {"type": "strin"}}}),
        },
        ..Default::default()
    };
    config.max_new_tokens = 4;
    let err = engine::generate(&lm.model, &lm.tokenizer, vec![1, 2, 3], config, 64, |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("response_format") && err.contains("strin"),
        "{err}"
    );
}
