use super::*;

/// Streams `pieces` one after another; returns (reasoning, content, calls) and checks that no
/// delta carries a marker.
fn stream(pieces: &[&str]) -> (String, String, Vec<Value>) {
    let mut s = HarmonyStream::default();
    let mut deltas = Vec::new();
    for p in pieces {
        deltas.extend(s.push(p));
    }
    let (rest, calls) = s.finish("call");
    deltas.extend(rest);
    let (mut reasoning, mut content) = (String::new(), String::new());
    for d in deltas {
        let (Delta::Reasoning(t) | Delta::Content(t)) = &d;
        assert!(
            !MARKERS.iter().any(|m| t.contains(m)),
            "a marker leaked: {d:?}"
        );
        match d {
            Delta::Reasoning(t) => reasoning.push_str(&t),
            Delta::Content(t) => content.push_str(&t),
        }
    }
    (reasoning, content, calls)
}

/// Every way of cutting `text` in two, and one character at a time, reads as it does whole.
fn check_splits(text: &str) {
    let whole = parse(text, "call");
    for (i, _) in text.char_indices() {
        assert_eq!(stream(&[&text[..i], &text[i..]]), whole, "split at {i}");
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(stream(&pieces), whole, "one character at a time");
}

const ANSWER: &str = "<|channel|>analysis<|message|>User asks 2+2. Easy.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.";

const CALL: &str = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"Paris\"}";

#[test]
fn reasoning_and_answer_are_apart() {
    let (reasoning, content, calls) = parse(ANSWER, "call");
    assert_eq!(reasoning, "User asks 2+2. Easy.");
    assert_eq!(content, "2 + 2 = 4.");
    assert!(calls.is_empty());
    // The end token's text, when a caller keeps it, changes nothing.
    assert_eq!(
        parse(&format!("{ANSWER}<|return|>"), "call").1,
        "2 + 2 = 4."
    );
    check_splits(ANSWER);
}

#[test]
fn a_call_in_the_commentary_channel() {
    let (reasoning, content, calls) = parse(CALL, "call");
    assert_eq!(reasoning, "Need weather.");
    assert_eq!(content, "");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["id"], "call-0");
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(
        calls[0]["function"]["arguments"],
        "{\"location\":\"Paris\"}"
    );
    assert_eq!(parse(&format!("{CALL}<|call|>"), "call").2, calls);
    check_splits(CALL);
}

#[test]
fn a_call_without_analysis_and_the_recipient_before_the_channel() {
    let text = " to=functions.lookup<|channel|>commentary json<|message|>{\"q\": \"rust\"}";
    let (reasoning, content, calls) = parse(text, "c");
    assert_eq!((reasoning.as_str(), content.as_str()), ("", ""));
    assert_eq!(calls[0]["function"]["name"], "lookup");
    assert_eq!(calls[0]["function"]["arguments"], "{\"q\": \"rust\"}");
    check_splits(text);
    // The same after a reasoning message, and in the analysis channel.
    let text = "<|channel|>analysis<|message|>hm<|end|><|start|>assistant to=functions.f<|channel|>analysis<|constrain|>json<|message|>{}";
    let (reasoning, _, calls) = parse(text, "c");
    assert_eq!(reasoning, "hm");
    assert_eq!(calls[0]["function"]["name"], "f");
}

#[test]
fn a_preamble_is_content_and_stray_channels_are_skipped() {
    let text = "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\":1}";
    let (_, content, calls) = parse(text, "c");
    assert_eq!(content, "Let me check.");
    assert_eq!(calls.len(), 1);
    // gpt-oss-20b sometimes writes a commentary channel before the analysis one.
    let text = "<|channel|>commentary<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>ok";
    assert_eq!(parse(text, "c"), ("think".into(), "ok".into(), vec![]));
    // A message to a built-in tool the model was not offered is dropped.
    let text = "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary to=browser.search <|constrain|>json<|message|>{\"query\":\"x\"}";
    assert_eq!(parse(text, "c"), ("a".into(), String::new(), vec![]));
}

#[test]
fn unfinished_replies_keep_what_they_have() {
    // Cut in the reasoning (the output cap): the reasoning so far, no content.
    assert_eq!(
        parse("<|channel|>analysis<|message|>Let me", "c"),
        ("Let me".into(), String::new(), vec![])
    );
    // Cut in a header: nothing more.
    let cut = "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>fin";
    assert_eq!(parse(cut, "c"), ("x".into(), String::new(), vec![]));
    // Cut in a call's arguments: they are not JSON, so they come back as content.
    let cut = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": ";
    assert_eq!(parse(cut, "c"), (String::new(), "{\"a\":".into(), vec![]));
}

#[test]
fn text_that_is_not_harmony_is_content() {
    for text in [
        "Hello there, <b>world</b> <|not a marker|>",
        "4",
        "",
        "to be or not to be",
        "assistant is my name",
    ] {
        let (reasoning, content, calls) = parse(text, "c");
        assert_eq!(
            (reasoning.as_str(), content.as_str()),
            ("", text),
            "{text:?}"
        );
        assert!(calls.is_empty());
        check_splits(text);
    }
    // Markers out of place never panic nor leak, whatever their order.
    let markers = [
        START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL, "x", "to=", " ",
    ];
    for a in markers {
        for b in markers {
            for c in markers {
                let text = format!("{a}{b}hello{c}world");
                stream(&[&text]);
                check_splits(&text);
            }
        }
    }
    // A reply in the final channel only, and one continued from a final message's prefix.
    assert_eq!(parse("<|channel|>final<|message|>hi", "c").1, "hi");
    assert_eq!(parse("Paris is lovely.", "c").1, "Paris is lovely.");
    // A very long "header" is not one.
    let long = format!("to={}", "x".repeat(300));
    assert_eq!(parse(&long, "c").1, long);
}

#[test]
fn partial_markers_are_held_back_then_released() {
    let mut s = HarmonyStream::default();
    assert_eq!(
        s.push("<|channel|>analysis<|message|>a <"),
        vec![Delta::Reasoning("a ".into())]
    );
    assert_eq!(s.push("|e"), vec![]);
    assert_eq!(s.push("nd|><|start|>assistant<|chan"), vec![]);
    assert_eq!(
        s.push("nel|>final<|message|>b"),
        vec![Delta::Content("b".into())]
    );
    assert_eq!(s.push(" <"), vec![Delta::Content(" ".into())]);
    assert_eq!(s.push("3"), vec![Delta::Content("<3".into())]);
    assert_eq!(s.push("<|"), vec![]);
    assert_eq!(s.finish("c"), (vec![Delta::Content("<|".into())], vec![]));
}

#[test]
fn the_forced_grammar_names_each_function() {
    let g = forced_call_grammar(&[
        ("get_weather".into(), json!({"type": "object"})),
        ("time".into(), json!({"type": "object", "properties": {}})),
    ]);
    assert!(g.starts_with("start: analysis? call\n"), "{g}");
    assert!(g.contains("call: call_0 | call_1\n"), "{g}");
    assert!(g.contains(
        "call_0: <|channel|> \"commentary to=functions.get_weather \" <|constrain|> \"json\" <|message|> %json {\"type\":\"object\",\"x-guidance\":{"
    ), "{g}");
}

#[test]
fn llama_cpps_cases_read_alike() {
    // From llama.cpp's tests/test-chat.cpp (the gpt-oss parser's cases).
    let said = "Hello, world!\nWhat's up?";
    for text in [
        format!("<|channel|>final<|message|>{said}"),
        format!("<|channel|>commentary<|message|>{said}"),
    ] {
        assert_eq!(parse(&text, "c"), (String::new(), said.into(), vec![]));
    }
    for text in [
        " to=functions.special_function<|channel|>analysis<|message|>{\"arg1\": 1}",
        "<|channel|>analysis to=functions.special_function<|message|>{\"arg1\": 1}",
        " to=functions.special_function<|channel|>analysis <|constrain|>json<|message|>{\"arg1\": 1}",
        "<|channel|>commentary to=functions.special_function<|message|>{\"arg1\": 1}",
    ] {
        let (_, content, calls) = parse(text, "c");
        assert_eq!(content, "", "{text}");
        assert_eq!(calls[0]["function"]["name"], "special_function", "{text}");
        assert_eq!(calls[0]["function"]["arguments"], "{\"arg1\": 1}", "{text}");
    }
    let edit = "<|channel|>analysis<|message|>Thinking about edit...<|end|><|start|>assistant<|channel|>commentary to=functions.edit <|constrain|>json<|message|>{\"oldString\": \"if (part < railCount - 1) {\", \"newString\": \"if (part < 4) {\", \"replaceAll\": false}";
    let (reasoning, _, calls) = parse(edit, "c");
    assert_eq!(reasoning, "Thinking about edit...");
    assert_eq!(
        calls[0]["function"]["arguments"],
        "{\"oldString\": \"if (part < railCount - 1) {\", \"newString\": \"if (part < 4) {\", \"replaceAll\": false}"
    );
    check_splits(edit);
    let structured = "<|channel|>analysis<|message|>JSON it is<|end|><|start|>assistant<|channel|>final <|constrain|>json<|message|>{\"amount\": 123.45}";
    assert_eq!(parse(structured, "c").1, "{\"amount\": 123.45}");
    let builtin = "<|channel|>analysis<|message|>run it<|end|><|start|>assistant to=container.exec<|channel|>commentary<|message|>python3 -c 'print(1)'";
    assert_eq!(
        parse(builtin, "c"),
        ("run it".into(), String::new(), vec![])
    );
}

/// The reply's bytes that `take_content` reports as content, after `text` streamed in `pieces`
/// (split at every character boundary in turn) and finished.
fn content_bytes(text: &str, calls: bool) -> String {
    let mut whole = None;
    for (i, _) in text.char_indices() {
        let mut s = HarmonyStream::new(calls);
        let mut ranges = Vec::new();
        let mut decided_before = 0;
        for piece in [&text[..i], &text[i..]] {
            s.push(piece);
            let (decided, content) = s.take_content();
            assert!(decided >= decided_before && decided <= text.len());
            assert!(
                content.iter().all(|r| r.end <= decided),
                "{content:?} past {decided}"
            );
            decided_before = decided;
            ranges.extend(content);
        }
        s.finish("c");
        let (decided, content) = s.take_content();
        assert_eq!(decided, text.len());
        ranges.extend(content);
        let bytes: String = ranges.iter().map(|r| &text[r.clone()]).collect();
        assert_eq!(whole.get_or_insert(bytes.clone()), &bytes, "split at {i}");
    }
    whole.unwrap_or_default()
}

#[test]
fn the_content_is_located_in_the_reply() {
    assert_eq!(content_bytes(ANSWER, true), "2 + 2 = 4.");
    assert_eq!(content_bytes(CALL, true), "");
    // Calls off: the arguments are the content.
    assert_eq!(content_bytes(CALL, false), "{\"location\":\"Paris\"}");
    // Arguments that are not JSON, and text that is not harmony, are content.
    let cut = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": ";
    assert_eq!(content_bytes(cut, true), "{\"a\": ");
    for text in [
        "Hello <b>there</b>",
        "assistant is my name",
        "<|channel|>final<|message|>hi",
    ] {
        assert_eq!(content_bytes(text, true), parse(text, "c").1, "{text}");
    }
}

#[test]
fn without_calls_a_calls_body_is_content() {
    let mut s = HarmonyStream::new(false);
    let mut deltas = s.push(CALL);
    let (rest, calls) = s.finish("c");
    deltas.extend(rest);
    assert!(calls.is_empty());
    assert_eq!(
        deltas,
        vec![
            Delta::Reasoning("Need weather.".into()),
            Delta::Content("{\"location\":\"Paris\"}".into())
        ]
    );
}

#[test]
fn structured_output_goes_in_the_final_channel() {
    use crate::grammar::ResponseFormat;
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let g = final_grammar(&ResponseFormat::JsonSchema {
        schema: schema.clone(),
    })
    .unwrap()
    .unwrap();
    assert!(g.starts_with("start: analysis? final\n"), "{g}");
    assert!(
        g.contains(
            "final: <|channel|> \"final\" (\" \" <|constrain|> \"json\")? <|message|> answer\n"
        ),
        "{g}"
    );
    assert!(g.contains(&format!("answer: %json {schema}\n")), "{g}");
    let g = final_grammar(&ResponseFormat::Gbnf {
        grammar: "root ::= \"yes\" | \"no\"".into(),
    })
    .unwrap()
    .unwrap();
    assert!(
        g.contains("final: <|channel|> \"final\" <|message|> answer\nanswer: %lark {\n"),
        "{g}"
    );
    assert_eq!(final_grammar(&ResponseFormat::Text), Ok(None));
    assert!(final_grammar(&ResponseFormat::Gbnf {
        grammar: "root ::= (".into()
    })
    .is_err());
}
