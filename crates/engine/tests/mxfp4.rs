//! MXFP4 against llama.cpp: `tests/tiny/mxfp4.gguf` (written by `tools/tiny_models/mxfp4.py`)
//! holds MXFP4 tensors quantized by gguf-py, llama.cpp's Python package, next to gguf-py's F32
//! dequantization of them. pld opens the file (candle alone refuses it), reads the tensors and
//! their expert slices, and dequantizes them to exactly gguf-py's bits.

use engine::gguf::GgufFile;
use engine::kernels::{isa, quantize, QMatrix, TensorType};
use engine::weights::{self, Precision};
use std::path::Path;

fn file() -> GgufFile {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tiny/mxfp4.gguf");
    GgufFile::open(&path).expect("the MXFP4 file opens")
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn mxfp4_tensors_dequantize_to_gguf_py_values() {
    let f = file();
    assert_eq!(f.tensor_dtype("w"), Some(TensorType::Mxfp4));
    let w = weights::matrix(&f, "w").unwrap();
    assert_eq!((w.dtype, w.rows, w.cols), (TensorType::Mxfp4, 2, 96));
    let want = weights::matrix(&f, "w.dequantized").unwrap().dequantize();
    assert_eq!(bits(&w.dequantize()), bits(&want));
}

/// Our quantizer follows ggml's rule: the same bytes as gguf-py from the same floats.
#[test]
fn mxfp4_quantization_equals_gguf_py() {
    let f = file();
    let source = weights::matrix(&f, "w.source").unwrap().dequantize();
    let stored = f.tensor("w").unwrap();
    assert_eq!(
        quantize(TensorType::Mxfp4, &source),
        stored.bytes.as_slice()
    );
}

/// A 3-D expert tensor sliced per expert (17-byte blocks: the second expert starts off 4-byte
/// alignment), exponents at the ends of the range included.
#[test]
fn mxfp4_experts_slice_and_dequantize_to_gguf_py_values() {
    let f = file();
    let name = "blk.0.ffn_up_exps.weight";
    let experts = weights::expert_matrices(&f, name, 3, (3, 64), Precision::Stored, isa()).unwrap();
    let want: Vec<f32> = f
        .tensor("blk.0.ffn_up_exps.dequantized")
        .unwrap()
        .bytes
        .as_slice()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(want.len(), 3 * 3 * 64);
    assert_eq!(experts.len(), 3);
    for (e, m) in experts.iter().enumerate() {
        assert_eq!((m.dtype, m.rows, m.cols), (TensorType::Mxfp4, 3, 64));
        assert_eq!(
            bits(&m.dequantize()),
            bits(&want[e * 192..(e + 1) * 192]),
            "expert {e}"
        );
    }
    // The wrong expert count is refused by name.
    match weights::expert_matrices(&f, name, 2, (3, 64), Precision::Stored, isa()) {
        Err(e) => assert!(e.to_string().contains(name), "{e}"),
        Ok(_) => panic!("two experts taken from three"),
    }
    // At f32 precision the experts hold the same values.
    let f32s = weights::expert_matrices(&f, name, 3, (3, 64), Precision::F32, isa()).unwrap();
    for (a, b) in f32s.iter().zip(&experts) {
        assert_eq!(bits(&a.dequantize()), bits(&b.dequantize()));
    }
}

/// An MXFP4 matrix in a product: every row against the f64 product of its dequantized values.
#[test]
fn mxfp4_file_matrix_multiplies() {
    let f = file();
    let w: QMatrix = weights::product_matrix(&f, "w", 2, 96, Precision::Stored, isa()).unwrap();
    let wf = w.dequantize();
    let x: Vec<f32> = (0..96)
        .map(|i| ((i * 37) % 17) as f32 / 8.0 - 1.0)
        .collect();
    let mut out = [0f32; 2];
    engine::kernels::matmul(&x, 1, &w, &mut out);
    for j in 0..2 {
        let (exact, mag) = (0..96).fold((0f64, 0f64), |(s, m), t| {
            let p = x[t] as f64 * wf[j * 96 + t] as f64;
            (s + p, m + p.abs())
        });
        assert!(
            (out[j] as f64 - exact).abs() <= 0.02 * mag,
            "row {j}: {} vs {exact}",
            out[j]
        );
    }
}
