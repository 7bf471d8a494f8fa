//! `pld chat`: a conversation in the terminal. Each turn renders the whole history with the
//! model's chat template, as a chat client would send it, and starts from the prefix cache the
//! earlier turns left, so only the new message is prefilled. Answers stream as they are verified;
//! `/stats` shows each answer's speculation figures. Ctrl-C stops an answer; Ctrl-C or Ctrl-D at
//! the prompt ends the conversation.

use crate::common::{PrefixCacheDirArgs, RunArgs, SamplingArgs};
use crate::spec::SpecArgs;
use clap::Args;
use engine::{
    FinishReason, GenerationConfig, GenerationOutput, GenerationSettings, LoadedModel, Message,
    PrefixCache,
};
use rustyline::error::ReadlineError;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct ChatArgs {
    /// Model alias (fetched on first use) or path to a .gguf file.
    #[arg(long, default_value = crate::common::DEFAULT_MODEL)]
    pub model: String,
    #[command(flatten)]
    pub kv: crate::common::KvCacheArgs,
    /// A system message that opens the conversation.
    #[arg(long)]
    pub system: Option<String>,
    /// New tokens per answer at most.
    #[arg(long, default_value_t = 1024)]
    pub max_tokens: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Show each answer's figures (as `/stats` does).
    #[arg(long)]
    pub stats: bool,
    #[command(flatten)]
    pub run: RunArgs,
    #[command(flatten)]
    pub prefix_cache: PrefixCacheDirArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
}

const HELP: &str = "/stats toggles each answer's figures, /clear starts over, /exit (or Ctrl-D) \
ends; Ctrl-C stops an answer";

/// The conversation so far and what it runs on.
struct Chat {
    lm: LoadedModel,
    config: GenerationConfig,
    ctx: usize,
    system: Option<String>,
    history: Vec<Message>,
    prefix: PrefixCache,
    show_stats: bool,
    /// Set by Ctrl-C while an answer is being generated.
    interrupted: Arc<AtomicBool>,
}

pub fn run(a: ChatArgs) -> anyhow::Result<()> {
    crate::common::init_threads(a.run.threads)?;
    let speculation = a.spec.resolve()?;
    let lm = crate::common::load_model(&a.model, &a.kv)?;
    if lm.chat_template.is_none() {
        eprintln!(
            "note: {} has no chat template; a plain one is used",
            lm.name
        );
    }
    let ctx = a
        .run
        .ctx_size
        .unwrap_or(lm.model.config.context_len)
        .min(lm.model.config.context_len);
    let interrupted = Arc::new(AtomicBool::new(false));
    let flag = interrupted.clone();
    // At the prompt the line editor reads Ctrl-C as a key; while an answer runs it is a signal.
    ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))
        .map_err(|e| anyhow::anyhow!("cannot catch Ctrl-C: {e}"))?;
    let config = crate::common::generation_config(
        GenerationSettings {
            max_tokens: Some(a.max_tokens),
            sampling: a.sampling.settings(),
            ..Default::default()
        },
        speculation,
    )?;
    let mut chat = Chat {
        prefix: a.prefix_cache.open(&lm)?,
        lm,
        config,
        ctx,
        system: a.system.clone(),
        history: Vec::new(),
        show_stats: a.stats,
        interrupted,
    };
    chat.clear();
    eprintln!("pld chat with {} ({HELP})", chat.lm.name);
    let mut editor = rustyline::DefaultEditor::new()?;
    loop {
        let line = match editor.readline(">>> ") {
            Ok(line) => line,
            Err(ReadlineError::Interrupted | ReadlineError::Eof) => break,
            Err(e) => return Err(e.into()),
        };
        let text = line.trim();
        match text {
            "" => continue,
            "/exit" | "/quit" | "/bye" => break,
            "/stats" => {
                chat.show_stats = !chat.show_stats;
                let state = if chat.show_stats { "on" } else { "off" };
                eprintln!("figures after each answer: {state}");
            }
            "/clear" => {
                chat.clear();
                eprintln!("the conversation is cleared");
            }
            "/help" | "/?" => eprintln!("{HELP}"),
            _ => {
                let _ = editor.add_history_entry(text);
                if let Err(e) = chat.turn(text) {
                    eprintln!("error: {e}");
                }
            }
        }
    }
    println!();
    Ok(())
}

impl Chat {
    /// Forgets the conversation (the system message stays).
    fn clear(&mut self) {
        self.history.clear();
        if let Some(s) = &self.system {
            self.history.push(Message::new("system", s));
        }
    }

    /// One user message and the streamed answer; a failed turn leaves the history as it was.
    fn turn(&mut self, text: &str) -> anyhow::Result<()> {
        self.history.push(Message::new("user", text));
        match self.answer() {
            Ok(out) => {
                self.history.push(Message::new("assistant", &out.text));
                if out.finish_reason == FinishReason::Cancelled {
                    eprintln!("[stopped]");
                }
                if self.show_stats {
                    eprintln!("[{}]", crate::generate::summary_line(&out));
                }
                Ok(())
            }
            Err(e) => {
                self.history.pop();
                Err(e)
            }
        }
    }

    fn answer(&mut self) -> anyhow::Result<GenerationOutput> {
        let prompt = self.lm.render_chat(&self.history)?;
        let ids = self.lm.tokenizer.encode_prompt(&prompt)?;
        self.interrupted.store(false, Ordering::SeqCst);
        let stdout = std::io::stdout();
        let interrupted = &self.interrupted;
        let out = engine::generate_reusing(
            &self.lm.model,
            &self.lm.tokenizer,
            ids,
            self.config.clone(),
            self.ctx,
            Some(&mut self.prefix),
            |t| {
                let mut o = stdout.lock();
                let _ = o.write_all(t.as_bytes());
                let _ = o.flush();
                !interrupted.load(Ordering::SeqCst)
            },
        )
        .map_err(|e| match e {
            engine::EngineError::PromptTooLong { .. } => {
                anyhow::anyhow!("{e}; /clear starts a new conversation")
            }
            e => e.into(),
        })?;
        println!();
        Ok(out)
    }
}
