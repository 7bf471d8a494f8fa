//! `pld chat` driven through a pseudo-terminal, as a user types: two turns (the second's prompt
//! starts from the first's cache, as its figures show), Ctrl-C stopping an answer, and Ctrl-D at
//! the prompt ending the program cleanly.

use rexpect::session::PtySession;
use std::process::Command;

fn start(max_tokens: &str) -> PtySession {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pld"));
    cmd.args([
        "chat",
        "--model",
        "smollm2-135m",
        "--max-tokens",
        max_tokens,
        "--stats",
        "--threads",
        "2",
    ]);
    rexpect::session::spawn_command(cmd, Some(300_000)).expect("pld chat starts")
}

/// The prompt size and cached tokens from an answer's figures line.
fn figures(p: &mut PtySession) -> (usize, usize) {
    let (_, line) = p
        .exp_regex(r"\[prompt \d+ tokens, \d+ cached")
        .expect("figures after the answer");
    let numbers: Vec<usize> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    (numbers[0], numbers[1])
}

#[test]
fn a_conversation_reuses_its_cache_and_ends_cleanly() {
    let mut p = start("24");
    p.exp_string(">>> ").expect("a prompt");
    p.send_line("List three fruits.").unwrap();
    let (first_prompt, first_cached) = figures(&mut p);
    assert_eq!(first_cached, 0, "nothing is cached before the first turn");
    p.exp_string(">>> ")
        .expect("a prompt after the first answer");
    p.send_line("Now three vegetables.").unwrap();
    let (second_prompt, second_cached) = figures(&mut p);
    assert!(second_prompt > first_prompt);
    assert!(
        second_cached >= first_prompt / 16 * 16 && second_cached > 0,
        "the second turn reused {second_cached} tokens; the first prompt had {first_prompt}"
    );

    // Ctrl-D at the prompt ends the program with success.
    p.exp_string(">>> ").unwrap();
    p.send_control('d').unwrap();
    p.exp_eof().expect("pld chat exits");
    assert_exit_success(&mut p);
}

fn assert_exit_success(p: &mut PtySession) {
    let status = p.process().wait().unwrap();
    assert!(
        matches!(status, rexpect::process::WaitStatus::Exited(_, 0)),
        "exit status {status:?}"
    );
}

/// Ctrl-C while an answer streams stops it (and returns to the prompt); Ctrl-C at the prompt
/// ends the program with success.
#[test]
fn ctrl_c_stops_an_answer_then_ends_the_chat() {
    let mut p = start("4000");
    p.exp_string(">>> ").unwrap();
    p.send_line("/stats").unwrap();
    p.exp_string("figures after each answer: off").unwrap();
    p.exp_string(">>> ").unwrap();
    p.send_line("Tell me a very long story about the sea.")
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    p.send_control('c').unwrap();
    p.exp_string("[stopped]").expect("the answer stops");
    p.exp_string(">>> ").expect("the prompt again");
    p.send_control('c').unwrap();
    p.exp_eof().expect("pld chat exits");
    assert_exit_success(&mut p);
}
