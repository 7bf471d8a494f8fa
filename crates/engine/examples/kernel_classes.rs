//! The kernel classes this CPU runs (`Isa::available()`): the ones the kernel tests compare with
//! the scalar reference here, and the one pld picks. `.ci/run` prints it beside the tests, so that
//! CI's log says which classes its tests covered: `cargo run --release --example kernel_classes`.
use engine::kernels::{amx_status, isa, Isa};

fn main() {
    let covered: Vec<&str> = Isa::available().into_iter().map(Isa::name).collect();
    println!(
        "kernel classes the tests cover on this CPU: {}",
        covered.join(", ")
    );
    println!("the class pld runs here: {}", isa().name());
    if let Err(why) = amx_status() {
        println!("not covered: amx ({why})");
    }
}
