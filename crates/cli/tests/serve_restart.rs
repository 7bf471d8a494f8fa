//! `pld serve --prefix-cache-dir` as a user runs it, in real processes: a restarted server reads
//! a prompt's prefix from the directory and answers exactly as the cold server did; a server
//! killed in the middle of its writes, a byte-flipped file and a truncated one cost only
//! recomputation, with a line in the log.

use serde_json::{json, Value};
use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn smollm_path() -> PathBuf {
    let o = Command::new(env!("CARGO_BIN_EXE_pld"))
        .args(["fetch", "smollm2-135m"])
        .output()
        .expect("pld runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8(o.stdout).unwrap();
    PathBuf::from(stdout.lines().last().expect("a path line").trim())
}

/// A server over `dir`, its log in `log`; returns once it answers.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(model: &Path, dir: &Path, log: &Path) -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(env!("CARGO_BIN_EXE_pld"))
            .args(["serve", "--threads", "1", "--port", &port.to_string()])
            .arg("--model")
            .arg(model)
            .arg("--prefix-cache-dir")
            .arg(dir)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(fs::File::create(log).unwrap())
            .spawn()
            .expect("pld serve starts");
        let server = Server { child, port };
        let start = Instant::now();
        while server.get("/health").is_none() {
            assert!(start.elapsed() < Duration::from_secs(120), "no answer");
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    fn request(&self, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .ok()?;
        let mut reply = String::new();
        s.read_to_string(&mut reply).ok()?;
        let (head, body) = reply.split_once("\r\n\r\n")?;
        let status = head.split(' ').nth(1)?.parse().ok()?;
        Some((status, body.to_string()))
    }

    fn get(&self, path: &str) -> Option<(u16, String)> {
        self.request("GET", path, "")
    }

    /// A greedy completion of `prompt`: its text and (prompt, cached) token counts.
    fn complete(&self, prompt: &str) -> (String, u64, u64) {
        let body = json!({"prompt": prompt, "max_tokens": 12, "temperature": 0}).to_string();
        let (status, reply) = self
            .request("POST", "/v1/completions", &body)
            .expect("reply");
        assert_eq!(status, 200, "{reply}");
        let v: Value = serde_json::from_str(&reply).unwrap();
        let usage = &v["usage"];
        (
            v["choices"][0]["text"].as_str().unwrap().to_string(),
            usage["prompt_tokens"].as_u64().unwrap(),
            usage["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0),
        )
    }

    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

fn block_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|s| s.file_name().len() == 2)
        .flat_map(|s| fs::read_dir(s.path()).unwrap().flatten().map(|f| f.path()))
        .collect();
    files.sort();
    files
}

/// Waits until the writer has put `dir`'s files down (their count stops changing).
fn settled(dir: &Path) -> usize {
    let mut last = usize::MAX;
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let n = block_files(dir).len();
        if n == last {
            return n;
        }
        last = n;
    }
}

fn document(seed: usize, lines: usize) -> String {
    (0..lines)
        .map(|i| {
            format!(
                "Entry {i} of ledger {seed}: account {} moved {} units to account {}.\n",
                (i * 37 + seed) % 101,
                (i * 13 + 7) % 997,
                (i * 59 + seed * 3) % 103
            )
        })
        .collect()
}

#[test]
fn a_restarted_server_reads_its_prefixes_from_disk() {
    let model = smollm_path();
    let root = tempdir();
    let dir = root.join("cache");
    let prompt = format!("{}Which account moved the most units?", document(1, 60));

    let a = Server::start(&model, &dir, &root.join("a.log"));
    let (cold, prompt_tokens, cached) = a.complete(&prompt);
    assert_eq!(cached, 0);
    assert!(prompt_tokens > 1000, "{prompt_tokens} tokens");
    assert!(settled(&dir) as u64 >= prompt_tokens / 16 - 1);
    a.kill();

    // Restarted: the prefix comes from disk, the answer is the cold one.
    let b = Server::start(&model, &dir, &root.join("b.log"));
    let (warm, _, cached) = b.complete(&prompt);
    assert_eq!(warm, cold);
    assert!(
        cached * 10 >= prompt_tokens * 9,
        "{cached} of {prompt_tokens} cached"
    );

    // Killed in the middle of writing another long prompt's blocks.
    let before = block_files(&dir).len();
    let long = format!("{}Sum the units.", document(2, 120));
    let body = json!({"prompt": long, "max_tokens": 4}).to_string();
    let port = b.port;
    let sender = std::thread::spawn(move || {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let _ = write!(
            s,
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let _ = s.read_to_end(&mut Vec::new());
    });
    let start = Instant::now();
    while block_files(&dir).len() < before + 8 {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no blocks written"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    b.kill();
    sender.join().unwrap();

    // The first block of each prompt damaged by hand, so that both are read: one byte of rows
    // flipped, one file cut short. (A first block is the one whose parent hash, bytes 32..48 of
    // its header, is zero.)
    let firsts: Vec<PathBuf> = block_files(&dir)
        .into_iter()
        .filter(|f| fs::read(f).unwrap()[32..48].iter().all(|&b| b == 0))
        .collect();
    assert_eq!(firsts.len(), 2, "one first block per prompt");
    let mut bytes = fs::read(&firsts[0]).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    fs::write(&firsts[0], bytes).unwrap();
    let len = fs::metadata(&firsts[1]).unwrap().len();
    fs::File::options()
        .write(true)
        .open(&firsts[1])
        .unwrap()
        .set_len(len / 2)
        .unwrap();

    let c = Server::start(&model, &dir, &root.join("c.log"));
    let (again, _, _) = c.complete(&prompt);
    assert_eq!(again, cold);
    c.complete(&long);
    c.kill();
    let log = fs::read_to_string(root.join("c.log")).unwrap();
    assert!(
        log.matches("failed its check").count() == 2,
        "no log line for the damaged files:\n{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
    let _ = fs::remove_dir_all(&root);
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pld-serve-restart-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}
