//! `--record-requests DIR`: every request body appended to `DIR/requests.jsonl` as it arrives,
//! one JSON object a line: `{"time": <Unix seconds>, "api": "responses" | "messages" |
//! "chat.completions" | ..., "tenant": <key index>, "body": <the body as sent>}`. Agent traffic
//! recorded this way is replayed by `pld bench replay`.

use crate::tenant::Tenant;
use serde_json::{json, Value};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

pub struct Recorder {
    file: Mutex<File>,
}

impl Recorder {
    /// Opens (creating the folder, appending to the file) `dir/requests.jsonl`.
    pub fn create(dir: &Path) -> std::io::Result<Recorder> {
        std::fs::create_dir_all(dir)?;
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("requests.jsonl"))?;
        Ok(Recorder {
            file: Mutex::new(file),
        })
    }

    /// Appends one request (a body that is not JSON is kept as text). A failed write is logged,
    /// never the request's failure.
    pub fn write(&self, api: &str, tenant: Tenant, body: &[u8]) {
        let time = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let body: Value = serde_json::from_slice(body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned()));
        let line = json!({"time": time, "api": api, "tenant": tenant.0, "body": body});
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = writeln!(f, "{line}") {
            tracing::warn!("cannot record a request: {e}");
        }
    }
}
