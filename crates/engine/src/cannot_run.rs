//! Tests that cannot run on the CPU at hand, because it lacks the kernel class they test. Such a
//! test is `#[ignore]`d with the class it needs, so that `cargo test` names it as ignored instead
//! of passing without testing anything. Run with `--ignored` (`.ci/run` does), it calls
//! `cannot_run` where the CPU lacks the class: that fails the test, unless `PLD_ALLOW_SKIP=1`
//! lets it pass as not run, said on stderr with the test's name (shown with `--nocapture`).

/// The current test cannot run on this CPU, for `why`: a failure unless `PLD_ALLOW_SKIP=1`.
pub(crate) fn cannot_run(why: &str) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("this test");
    if std::env::var("PLD_ALLOW_SKIP").as_deref() != Ok("1") {
        panic!("{test} cannot run on this CPU: {why} (PLD_ALLOW_SKIP=1 lets it pass as not run)");
    }
    eprintln!("not run: {test}: {why}");
}
