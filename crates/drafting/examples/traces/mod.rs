//! What the drafting examples share: recorded greedy outputs, and one verification step replayed
//! against them.
//!
//! `load` reads `pld bench run`'s results.json (`rows[].turns[]`, each with `prompt_ids` and
//! `output_ids`) or `tools/vllm/compare.py`'s output (its plain greedy run's outputs).

use drafting::Drafter;
use serde_json::Value;

/// One recorded turn: its prompt and the output the model really produced.
pub struct Row {
    pub category: String,
    pub prompt: Vec<u32>,
    pub output: Vec<u32>,
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("a list of token ids")
        .iter()
        .map(|x| x.as_u64().expect("a token id") as u32)
        .collect()
}

pub fn load(path: &str) -> Vec<Row> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut rows = Vec::new();
    if let Some(list) = v.get("rows").and_then(Value::as_array) {
        for r in list {
            let category = r["category"].as_str().unwrap_or("all").to_owned();
            for t in r["turns"].as_array().expect("turns") {
                rows.push(Row {
                    category: category.clone(),
                    prompt: ids(&t["prompt_ids"]),
                    output: ids(&t["output_ids"]),
                });
            }
        }
        return rows;
    }
    let runs = v["runs"].as_array().expect("compare.py's runs");
    let greedy = runs
        .iter()
        .find(|r| r["drafter"] == "none")
        .expect("a plain greedy run");
    let outputs = greedy["outputs"].as_array().expect("outputs");
    for (p, out) in v["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .zip(outputs)
    {
        let file = p["file"].as_str().unwrap_or_default();
        let prefix = file.split('-').next().unwrap_or_default();
        rows.push(Row {
            category: format!("{prefix}/{}", p["category"].as_str().unwrap_or_default()),
            prompt: ids(&p["prompt_ids"]),
            output: ids(out),
        });
    }
    rows
}

/// What one replayed step did.
pub struct Step {
    /// Tokens proposed and sent.
    pub drafted: usize,
    /// Leading drafted tokens equal to the recorded output (may run past its end).
    pub matched: usize,
    /// Tokens the step emitted: the kept drafted tokens and the model's own.
    pub produced: usize,
}

/// One verification under greedy decoding, replayed: `drafter` proposes at most `k` tokens, the
/// draft is accepted up to its first token that differs from `rest` (the recorded output still
/// to come, not empty), the drafter is told the outcome and given the emitted tokens.
pub fn step(drafter: &mut Drafter, k: usize, rest: &[u32]) -> Step {
    let draft = drafter.propose(k, None).tokens().to_vec();
    let matched = draft.iter().zip(rest).take_while(|(a, b)| a == b).count();
    let produced = (matched + 1).min(rest.len());
    // The last emitted token is the model's own, even where the draft matched past the end.
    let path: Vec<usize> = (0..matched.min(produced - 1)).collect();
    drafter.observe(&path);
    for &t in &rest[..produced] {
        drafter.push(t);
    }
    Step {
        drafted: draft.len(),
        matched,
        produced,
    }
}
