//! gpt-oss's chat template (`tests/harmony/openai-gpt-oss-120b.jinja`, from llama.cpp's
//! `models/templates`) rendered by our renderer against golden renderings made by Jinja2 set up as
//! Hugging Face transformers sets it up (`tests/harmony/render_goldens.py` over `cases.json`):
//! the system message with its date and reasoning effort, a developer message, earlier turns
//! without their reasoning, the tools as a TypeScript namespace, a call with its reasoning, a
//! tool's result, and a last turn shown whole when no turn is opened. Both write what the
//! harmony spec (openai/harmony) describes: `<|start|>{role}<|message|>...<|end|>`, a call as
//! `<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{args}<|call|>`, its
//! result as `<|start|>functions.NAME to=assistant<|channel|>commentary<|message|>...<|end|>`.

use super::*;
use serde_json::Value;

const TEMPLATE: &str = include_str!("../../tests/harmony/openai-gpt-oss-120b.jinja");
const CASES: &str = include_str!("../../tests/harmony/cases.json");

fn golden(name: &str) -> &'static str {
    match name {
        "system_and_user" => include_str!("../../tests/harmony/system_and_user.txt"),
        "multi_turn" => include_str!("../../tests/harmony/multi_turn.txt"),
        "tool_round_trip" => include_str!("../../tests/harmony/tool_round_trip.txt"),
        "after_the_answer" => include_str!("../../tests/harmony/after_the_answer.txt"),
        other => panic!("no golden {other}"),
    }
}

fn template() -> ChatTemplate {
    ChatTemplate::new(TEMPLATE, "<|startoftext|>", "<|return|>").unwrap()
}

fn today() -> String {
    template_fns::strftime_now("%Y-%m-%d").unwrap()
}

#[test]
fn gpt_oss_renders_as_transformers_does() {
    let t = template();
    assert!(t.is_harmony());
    let cases: Vec<Value> = serde_json::from_str(CASES).unwrap();
    assert_eq!(cases.len(), 4);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let messages: Vec<Message> = serde_json::from_value(case["messages"].clone()).unwrap();
        let tools: Vec<Value> = case
            .get("tools")
            .map(|t| serde_json::from_value(t.clone()).unwrap())
            .unwrap_or_default();
        let options = RenderOptions {
            reasoning_effort: case["reasoning_effort"].as_str().map(String::from),
        };
        let agp = case["add_generation_prompt"].as_bool().unwrap();
        let out = t
            .render_with_options(&messages, &tools, agp, &options)
            .unwrap();
        let want = golden(name).replace("{DATE}", &today());
        assert_eq!(out, want, "{name}");
    }
}

#[test]
fn prompts_end_as_gpt_oss_continues_them() {
    let t = template();
    let user = Message::new("user", "Hi");
    let prefill = Message::new("assistant", "Hello, ");
    let opts = RenderOptions::default();
    let next = render(
        Some(&t),
        std::slice::from_ref(&user),
        &[],
        PromptEnd::Auto,
        &opts,
    )
    .unwrap();
    assert!(
        next.ends_with("<|start|>user<|message|>Hi<|end|><|start|>assistant"),
        "{next}"
    );
    // A last assistant message is continued in the final channel (as llama.cpp continues it).
    let cont = render(Some(&t), &[user, prefill], &[], PromptEnd::Auto, &opts).unwrap();
    assert_eq!(
        cont,
        format!("{next}<|channel|>final<|message|>Hello, "),
        "{cont}"
    );
    assert!(!template()
        .render(&[Message::new("user", "x")], true)
        .unwrap()
        .is_empty());
}

#[test]
fn a_calls_reasoning_replaces_its_content() {
    // OpenAI chat clients send a call's reasoning back as `reasoning_content` (here `thinking`)
    // and often its content too; the template refuses both, so the content is dropped.
    let t = template();
    let mut call = Message::new("assistant", "I will check.");
    call.thinking = Some("Need the tool.".into());
    call.tool_calls = Some(vec![serde_json::json!({
        "id": "c", "type": "function", "function": {"name": "now", "arguments": {}}
    })]);
    let tool = Message {
        tool_call_id: Some("c".into()),
        ..Message::new("tool", "12:00")
    };
    let tools = [
        serde_json::json!({"type": "function", "function": {"name": "now", "description": "The time"}}),
    ];
    let messages = [Message::new("user", "Time?"), call, tool];
    let opts = RenderOptions::default();
    let out = render(Some(&t), &messages, &tools, PromptEnd::Auto, &opts).unwrap();
    assert!(
        out.contains("<|start|>assistant<|channel|>analysis<|message|>Need the tool.<|end|><|start|>assistant to=functions.now<|channel|>commentary json<|message|>{}<|call|><|start|>functions.now to=assistant<|channel|>commentary<|message|>\"12:00\"<|end|><|start|>assistant"),
        "{out}"
    );
    // The effort the request asks for replaces the template's default.
    let high = RenderOptions {
        reasoning_effort: Some("high".into()),
    };
    let out = render(Some(&t), &messages[..1], &[], PromptEnd::Auto, &high).unwrap();
    assert!(out.contains("\nReasoning: high\n"), "{out}");
    let out = render(Some(&t), &messages[..1], &[], PromptEnd::Auto, &opts).unwrap();
    assert!(out.contains("\nReasoning: medium\n"), "{out}");
}
