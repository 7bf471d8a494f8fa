//! The traces replayed: one sequence's prompt and real output, sets of them in one unit, and
//! the JSON files they are read from.

use std::path::Path;

use serde_json::Value;

/// One sequence to replay: its prompt and the output the model really produced.
pub(crate) struct Trace {
    pub(crate) category: String,
    pub(crate) prompt: Vec<u32>,
    pub(crate) output: Vec<u32>,
}

/// A set of traces in one unit (real tokens, bytes or words).
pub(crate) struct TraceSet {
    pub(crate) unit: String,
    pub(crate) traces: Vec<Trace>,
}

pub(crate) fn read_trace_file(path: &Path) -> Result<Vec<Trace>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let value: Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let rows = value
        .as_array()
        .ok_or_else(|| format!("{}: expected a JSON list of traces", path.display()))?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ids = |v: Option<&Value>, field: &str, i: usize| -> Result<Vec<u32>, String> {
        v.and_then(Value::as_array)
            .ok_or_else(|| format!("{}: trace {i} has no list `{field}`", path.display()))?
            .iter()
            .map(|x| {
                x.as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .ok_or_else(|| {
                        format!("{}: trace {i}: `{field}` holds a non-id", path.display())
                    })
            })
            .collect()
    };
    rows.iter()
        .enumerate()
        .map(|(i, row)| {
            Ok(Trace {
                category: row
                    .get("category")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .unwrap_or_else(|| stem.clone()),
                prompt: ids(row.get("prompt"), "prompt", i)?,
                output: ids(row.get("output"), "output", i)?,
            })
        })
        .collect()
}
