//! The model config: every way the supported architectures differ, as fields read from GGUF
//! metadata (with each family's published defaults where its files leave a value out), so that one
//! generic decoder (`model`) runs them all.
//!
//! To add an architecture: add it to [`Architecture`] and [`Architecture::from_name`], describe its
//! conventions in [`Family::of`] (RoPE layout, norms, activation, which layers see a window, fused
//! tensors), and read any new metadata in [`Config::from_gguf`]. A difference the decoder cannot yet
//! express becomes a new field here and one branch in `model`, never a second decoder.

use crate::error::{EngineError, Result};
use crate::gguf::GgufFile;
use crate::weights;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// Llama 2/3, SmolLM, Mistral (which GGUF files call `llama`).
    Llama,
    Qwen2,
    Qwen3,
    /// Qwen3's attention with a mixture of experts in every layer.
    Qwen3Moe,
    Gemma3,
    Phi3,
    /// OpenAI's gpt-oss: attention sinks, sliding-window and full layers in turn, YaRN, biases,
    /// a mixture of experts with a clamped SwiGLU (`general.architecture` `gpt-oss`).
    #[serde(rename = "gpt-oss")]
    GptOss,
}

/// The `general.architecture` names pld runs, for error messages.
pub const SUPPORTED_ARCHITECTURES: &str =
    "llama (Llama 2/3, SmolLM2, Mistral, Mixtral), qwen2, qwen3, qwen3moe, gemma3, phi3, gpt-oss";

/// The mixture-of-experts families pld runs, for error messages.
pub const SUPPORTED_MIXTURES: &str = "qwen3moe, mixtral (llama with experts), gpt-oss";

/// `general.architecture` names of mixture-of-experts families pld does not run (yet): refused as
/// such rather than as unknown. A file of any other unknown architecture that declares experts
/// (`<arch>.expert_count`) is refused the same way.
const UNSUPPORTED_MIXTURES: &[&str] = &[
    "qwen2moe",
    "qwen3next",
    "qwen3vlmoe",
    "deepseek",
    "deepseek2",
    "granitemoe",
    "granitehybrid",
    "olmoe",
    "phimoe",
    "dbrx",
    "arctic",
    "grok",
    "jamba",
    "llama4",
    "glm4moe",
    "ernie4_5-moe",
    "hunyuan-moe",
    "bailingmoe",
    "bailingmoe2",
    "dots1",
    "exaone-moe",
    "smallthinker",
    "lfm2moe",
    "afmoe",
    "grovemoe",
    "minimax-m2",
];

impl Architecture {
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "llama" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            "qwen3" => Architecture::Qwen3,
            "qwen3moe" => Architecture::Qwen3Moe,
            "gemma3" => Architecture::Gemma3,
            "phi3" => Architecture::Phi3,
            "gpt-oss" => Architecture::GptOss,
            _ => return None,
        })
    }
}

/// How rotary embeddings pair the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (2i, 2i+1): llama GGUFs, whose q/k weights were permuted for it.
    Interleaved,
    /// Halves (i, i + d/2): qwen2, qwen3, gemma3, phi3 (GPT-NeoX style).
    Halves,
}

/// The gate's activation in the feed-forward block `down(act(gate(x)) * up(x))`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SiLU (SwiGLU): llama, qwen, phi3.
    Silu,
    /// GELU with the tanh approximation (GeGLU): gemma.
    GeluTanh,
    /// gpt-oss's SwiGLU with the gate and up clamped and `up + 1` (`kernels::swiglu_oai`).
    SiluClamped,
}

/// Gemma 3's RoPE base on its sliding-window layers; the GGUF metadata gives only the global
/// layers' base (`rope.freq_base`).
pub const GEMMA3_LOCAL_ROPE_BASE: f32 = 10_000.0;
/// Gemma 3 makes every 6th layer global (full attention) and the others sliding-window, a pattern
/// its GGUF metadata does not record.
pub const GEMMA3_GLOBAL_EVERY: usize = 6;

/// The conventions of one family that its GGUF files do not spell out.
#[derive(Clone, Copy, Debug)]
pub struct Family {
    pub rope_style: RopeStyle,
    pub activation: Activation,
    /// Per-head RMSNorm of queries and keys before RoPE (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: bool,
    /// Each block's output normalized again before the residual add (`post_attention_norm`,
    /// `post_ffw_norm`).
    pub post_norms: bool,
    /// Embeddings multiplied by sqrt(width).
    pub scale_embeddings: bool,
    /// One `attn_qkv` tensor instead of q, k, v, and `ffn_up` holding gate then up.
    pub fused: bool,
    /// With a sliding window: every n-th layer is global (`None`: the window applies to all).
    pub global_every: Option<usize>,
    /// With a sliding window: the base of the windowed layers' RoPE, when it differs.
    pub local_rope_base: Option<f32>,
    /// Whether the feed-forward blocks are mixtures of experts.
    pub experts: ExpertRule,
    /// A learned logit per query head in every attention softmax (`attn_sinks`): gpt-oss.
    pub sinks: bool,
    /// The name of the norm before the feed-forward block (`ffn_norm`; gpt-oss's files call it
    /// `post_attention_norm`).
    pub ffn_norm: &'static str,
    /// YaRN's correction range rounded out to whole dimensions (transformers' `truncate`, true
    /// but for gpt-oss, whose reference implementation does not round).
    pub yarn_truncate: bool,
}

/// Where a family's feed-forward blocks are mixtures of experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertRule {
    /// Dense: a file declaring experts is refused.
    Never,
    /// Where the file declares experts (`<arch>.expert_count`): llama files of Mixtral.
    WhenDeclared,
    /// Always: the expert metadata is required.
    Always,
}

/// A layer's mixture of experts: a router (`ffn_gate_inp`) scores `count` experts per row, the
/// `used` best are run (softmax over all scores, the chosen probabilities as weights, divided by
/// their sum when `renormalize`), and their outputs added with those weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeConfig {
    pub count: usize,
    pub used: usize,
    /// Each expert's feed-forward width.
    pub d_ff: usize,
    pub renormalize: bool,
}

impl Family {
    pub fn of(arch: Architecture) -> Self {
        let base = Family {
            rope_style: RopeStyle::Halves,
            activation: Activation::Silu,
            qk_norm: false,
            post_norms: false,
            scale_embeddings: false,
            fused: false,
            global_every: None,
            local_rope_base: None,
            experts: ExpertRule::Never,
            sinks: false,
            ffn_norm: "ffn_norm",
            yarn_truncate: true,
        };
        match arch {
            Architecture::Llama => Family {
                rope_style: RopeStyle::Interleaved,
                experts: ExpertRule::WhenDeclared,
                ..base
            },
            Architecture::Qwen2 => base,
            Architecture::Qwen3 => Family {
                qk_norm: true,
                ..base
            },
            Architecture::Qwen3Moe => Family {
                qk_norm: true,
                experts: ExpertRule::Always,
                ..base
            },
            Architecture::Gemma3 => Family {
                activation: Activation::GeluTanh,
                qk_norm: true,
                post_norms: true,
                scale_embeddings: true,
                global_every: Some(GEMMA3_GLOBAL_EVERY),
                local_rope_base: Some(GEMMA3_LOCAL_ROPE_BASE),
                ..base
            },
            Architecture::Phi3 => Family {
                fused: true,
                ..base
            },
            // Even layers see a window, odd ones everything (llama.cpp's swa pattern 2).
            Architecture::GptOss => Family {
                activation: Activation::SiluClamped,
                experts: ExpertRule::Always,
                global_every: Some(2),
                sinks: true,
                ffn_norm: "post_attention_norm",
                yarn_truncate: false,
                ..base
            },
        }
    }
}

/// Rotary embeddings of one kind of layer: the angle of pair `i` at position `p` is
/// `p * position_scale * base^(-2i / dims) / factors[i]`, and cos and sin are multiplied by
/// `attn_factor`.
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    pub base: f32,
    /// Per-pair frequency divisors: Llama 3's `rope_freqs`, Phi-3's `rope_factors_short/long`,
    /// YaRN's blend of interpolated and original frequencies (`yarn_factors`).
    pub factors: Option<Vec<f64>>,
    /// 1 / the linear scaling factor (`rope.scaling.type = linear`).
    pub position_scale: f32,
    /// Phi-3 LongRoPE's magnitude correction (`rope.scaling.attn_factor`).
    pub attn_factor: f32,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub arch: Architecture,
    pub n_layer: usize,
    pub d_model: usize,
    pub d_ff: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub rope_dims: usize,
    /// RoPE of the global (full-attention) layers, and of every layer without a window.
    pub rope: Rope,
    /// RoPE of the sliding-window layers where it differs (Gemma 3).
    pub rope_local: Option<Rope>,
    pub rms_eps: f32,
    /// Scale of attention scores: 1 / sqrt(head size), the size from `attention.key_length`.
    pub attn_scale: f32,
    /// Positions a windowed layer's query sees, itself included (`attention.sliding_window`):
    /// position `i` sees `j` when `i - j < window`.
    pub sliding_window: Option<usize>,
    pub vocab_size: usize,
    pub context_len: usize,
    /// The mixture of experts of every layer, in a mixture family.
    pub moe: Option<MoeConfig>,
}

/// The RoPE of the global layers: the base, Llama 3's or LongRoPE's factors, linear position
/// scaling and the attention factor.
fn global_rope(
    file: &GgufFile,
    arch_name: &str,
    rope_dims: usize,
    context_len: usize,
    family: Family,
) -> Result<Rope> {
    let key = |k: &str| format!("{arch_name}.{k}");
    let base = file.get_f32_opt(&key("rope.freq_base")).unwrap_or(10000.0);
    if file.get_str_opt(&key("rope.scaling.type")) == Some("yarn") {
        return yarn_rope(file, arch_name, base, rope_dims, family.yarn_truncate);
    }
    Ok(Rope {
        base,
        factors: rope_factors(file, arch_name, rope_dims, context_len)?,
        position_scale: match file.get_str_opt(&key("rope.scaling.type")) {
            Some("linear") => {
                let f = file
                    .get_f32_opt(&key("rope.scaling.factor"))
                    .ok_or_else(|| {
                        EngineError::BadMetadata(format!(
                            "'{}' is missing for linear rope scaling",
                            key("rope.scaling.factor")
                        ))
                    })?;
                if f.is_finite() && f > 0.0 {
                    1.0 / f
                } else {
                    1.0
                }
            }
            _ => 1.0,
        },
        attn_factor: file
            .get_f32_opt(&key("rope.scaling.attn_factor"))
            .filter(|f| f.is_finite() && *f > 0.0)
            .unwrap_or(1.0),
    })
}

impl Config {
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let arch_name = file.get_str("general.architecture")?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let declares_experts = file
            .get_u64_opt(&key("expert_count"))
            .is_some_and(|n| n > 0);
        let Some(arch) = Architecture::from_name(arch_name) else {
            if declares_experts || UNSUPPORTED_MIXTURES.contains(&arch_name) {
                return Err(EngineError::UnsupportedMixture {
                    name: arch_name.to_string(),
                    supported: SUPPORTED_MIXTURES,
                });
            }
            return Err(EngineError::UnsupportedArchitecture {
                name: arch_name.to_string(),
                supported: SUPPORTED_ARCHITECTURES,
            });
        };
        let family = Family::of(arch);
        let n_layer = file.get_u64(&key("block_count"))? as usize;
        let d_model = file.get_u64(&key("embedding_length"))? as usize;
        let moe = moe_config(file, arch_name, family.experts, declares_experts)?;
        let d_ff = match (file.get_u64_opt(&key("feed_forward_length")), moe) {
            (Some(ff), _) => ff as usize,
            // A mixture's file may give only the experts' width; no layer is dense then.
            (None, Some(m)) => m.d_ff,
            (None, None) => file.get_u64(&key("feed_forward_length"))? as usize,
        };
        let n_head = file.get_u64(&key("attention.head_count"))? as usize;
        let n_kv_head = file
            .get_u64_opt(&key("attention.head_count_kv"))
            .unwrap_or(n_head as u64) as usize;
        if n_head == 0 || n_kv_head == 0 || !n_head.is_multiple_of(n_kv_head) {
            return Err(EngineError::BadMetadata(format!(
                "inconsistent attention shape: {n_head} heads, {n_kv_head} kv heads"
            )));
        }
        let head_dim = match file.get_u64_opt(&key("attention.key_length")) {
            Some(k) => k as usize,
            None if d_model.is_multiple_of(n_head) => d_model / n_head,
            None => {
                return Err(EngineError::BadMetadata(format!(
                    "'{}' is missing and width {d_model} is not a multiple of {n_head} heads",
                    key("attention.key_length")
                )))
            }
        };
        if let Some(v) = file.get_u64_opt(&key("attention.value_length")) {
            if v as usize != head_dim {
                return Err(EngineError::BadMetadata(format!(
                    "value head size {v} differs from key head size {head_dim}"
                )));
            }
        }
        let rope_dims = file
            .get_u64_opt(&key("rope.dimension_count"))
            .unwrap_or(head_dim as u64) as usize;
        if head_dim == 0 || rope_dims > head_dim || !rope_dims.is_multiple_of(2) {
            return Err(EngineError::BadMetadata(format!(
                "rope dimension count {rope_dims} does not fit head size {head_dim}"
            )));
        }
        let rms_eps = file
            .get_f32_opt(&key("attention.layer_norm_rms_epsilon"))
            .unwrap_or(1e-5);
        let context_len = file.get_u64_opt(&key("context_length")).unwrap_or(2048) as usize;
        let sliding_window = file
            .get_u64_opt(&key("attention.sliding_window"))
            .filter(|&w| w > 0)
            .map(|w| w as usize);
        if family.global_every.is_some() && sliding_window.is_none() {
            return Err(EngineError::BadMetadata(format!(
                "'{}' is missing ({arch_name} alternates sliding-window and global layers)",
                key("attention.sliding_window")
            )));
        }

        let rope = global_rope(file, arch_name, rope_dims, context_len, family)?;
        // The windowed layers' own base: from the file where it says (`rope.freq_base_swa`),
        // else the family's default.
        let local_base = file
            .get_f32_opt(&key("rope.freq_base_swa"))
            .or(family.local_rope_base);
        let rope_local = local_base
            .filter(|_| sliding_window.is_some())
            .map(|base| Rope {
                base,
                factors: None,
                position_scale: 1.0,
                attn_factor: 1.0,
            });

        let embd = weights::matrix(file, "token_embd.weight")?;
        if embd.cols != d_model {
            return Err(EngineError::BadMetadata(format!(
                "token_embd width {} differs from embedding_length {d_model}",
                embd.cols
            )));
        }
        Ok(Config {
            arch,
            n_layer,
            d_model,
            d_ff,
            n_head,
            n_kv_head,
            head_dim,
            rope_dims,
            rope,
            rope_local,
            rms_eps,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            sliding_window,
            vocab_size: embd.rows,
            context_len,
            moe,
        })
    }

    /// The conventions of the model's family.
    pub fn family(&self) -> Family {
        Family::of(self.arch)
    }

    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_head * self.head_dim
    }

    /// Whether layer `layer` attends through the sliding window.
    pub fn is_windowed(&self, layer: usize) -> bool {
        self.sliding_window.is_some()
            && self
                .family()
                .global_every
                .is_none_or(|n| !(layer + 1).is_multiple_of(n))
    }

    /// The RoPE of layer `layer`.
    pub fn rope_of(&self, layer: usize) -> &Rope {
        match &self.rope_local {
            Some(local) if self.is_windowed(layer) => local,
            _ => &self.rope,
        }
    }
}

/// The per-pair frequency divisors, where the file has them: Llama 3's `rope_freqs`, or Phi-3's
/// LongRoPE pair (the long factors when the model's context exceeds the original one it was
/// trained at, as llama.cpp chooses them; the short ones otherwise).
fn rope_factors(
    file: &GgufFile,
    arch_name: &str,
    rope_dims: usize,
    context_len: usize,
) -> Result<Option<Vec<f64>>> {
    let pairs = rope_dims / 2;
    let name = if file.has_tensor("rope_freqs.weight") {
        "rope_freqs.weight"
    } else if file.has_tensor("rope_factors_short.weight") {
        let original = file
            .get_u64_opt(&format!("{arch_name}.rope.scaling.original_context_length"))
            .map_or(context_len, |v| v as usize);
        if context_len > original && file.has_tensor("rope_factors_long.weight") {
            "rope_factors_long.weight"
        } else {
            "rope_factors_short.weight"
        }
    } else {
        return Ok(None);
    };
    let factors = weights::vector(file, name, pairs)?;
    if factors.iter().any(|f| !f.is_finite() || *f <= 0.0) {
        return Err(EngineError::BadMetadata(format!(
            "'{name}' holds a factor that is not a positive number"
        )));
    }
    Ok(Some(factors.into_iter().map(f64::from).collect()))
}

/// YaRN (`rope.scaling.type = yarn`): each pair's frequency a blend of the original one and the
/// one divided by `rope.scaling.factor`, by a ramp between the pairs that turn `beta_fast` and
/// `beta_slow` times over `rope.scaling.original_context_length` (the high-frequency pairs keep
/// theirs); cos and sin scaled by `0.1 ln(factor) + 1` times `rope.scaling.attn_factor`. As
/// transformers' `_compute_yarn_parameters` and llama.cpp's `rope_yarn` compute it; `truncate`
/// rounds the ramp's ends out to whole pairs as both do by default.
fn yarn_rope(
    file: &GgufFile,
    arch_name: &str,
    base: f32,
    rope_dims: usize,
    truncate: bool,
) -> Result<Rope> {
    let key = |k: &str| format!("{arch_name}.rope.scaling.{k}");
    let required = |k: &str| {
        file.get_f32_opt(&key(k))
            .filter(|v| v.is_finite() && *v > 0.0)
            .ok_or_else(|| {
                EngineError::BadMetadata(format!(
                    "'{}' is missing or not a positive number (needed for yarn rope scaling)",
                    key(k)
                ))
            })
    };
    let factor = required("factor")? as f64;
    let original = required("original_context_length")? as f64;
    let fast = file.get_f32_opt(&key("yarn_beta_fast")).unwrap_or(32.0) as f64;
    let slow = file.get_f32_opt(&key("yarn_beta_slow")).unwrap_or(1.0) as f64;
    let extrapolation = file.get_f32_opt(&key("yarn_ext_factor")).unwrap_or(1.0) as f64;
    Ok(Rope {
        base,
        factors: Some(yarn_factors(
            base as f64,
            rope_dims,
            factor,
            original,
            (fast, slow),
            extrapolation,
            truncate,
        )),
        position_scale: 1.0,
        attn_factor: {
            let magnitude = if factor > 1.0 {
                0.1 * factor.ln() + 1.0
            } else {
                1.0
            };
            let extra = file
                .get_f32_opt(&key("attn_factor"))
                .filter(|f| f.is_finite() && *f > 0.0)
                .unwrap_or(1.0);
            (magnitude * extra as f64) as f32
        },
    })
}

/// YaRN's per-pair divisors of the frequencies (see `yarn_rope`).
pub fn yarn_factors(
    base: f64,
    dims: usize,
    factor: f64,
    original: f64,
    (beta_fast, beta_slow): (f64, f64),
    extrapolation: f64,
    truncate: bool,
) -> Vec<f64> {
    // The pair index at which a frequency turns `turns` times over the original context.
    let pair_of = |turns: f64| {
        dims as f64 * (original / (turns * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
    };
    let (mut low, mut high) = (pair_of(beta_fast), pair_of(beta_slow));
    if truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    let (low, high) = (low.max(0.0), high.min(dims as f64 - 1.0));
    let span = if high == low { 0.001 } else { high - low };
    (0..dims / 2)
        .map(|i| {
            let ramp = ((i as f64 - low) / span).clamp(0.0, 1.0);
            // The share of the original (extrapolated) frequency.
            let keep = (1.0 - ramp) * extrapolation;
            1.0 / ((1.0 - keep) / factor + keep)
        })
        .collect()
}

/// The mixture of experts a file declares, checked against what its family allows: `None` for a
/// dense model. The router's weights follow llama.cpp: renormalised over the chosen experts
/// unless the file says otherwise (`expert_weights_norm`), as Mixtral and Qwen3-MoE are.
fn moe_config(
    file: &GgufFile,
    arch_name: &str,
    rule: ExpertRule,
    declared: bool,
) -> Result<Option<MoeConfig>> {
    let key = |k: &str| format!("{arch_name}.{k}");
    match rule {
        ExpertRule::Never if declared => {
            return Err(EngineError::UnsupportedMixture {
                name: format!("{arch_name} with experts"),
                supported: SUPPORTED_MIXTURES,
            })
        }
        ExpertRule::Never | ExpertRule::WhenDeclared if !declared => return Ok(None),
        _ => {}
    }
    let count = file.get_u64(&key("expert_count"))? as usize;
    let used = file.get_u64(&key("expert_used_count"))? as usize;
    if count == 0 || used == 0 || used > count {
        return Err(EngineError::BadMetadata(format!(
            "{used} of {count} experts used per token"
        )));
    }
    if file
        .get_u64_opt(&key("expert_shared_count"))
        .is_some_and(|n| n > 0)
    {
        return Err(EngineError::UnsupportedMixture {
            name: format!("{arch_name} with shared experts"),
            supported: SUPPORTED_MIXTURES,
        });
    }
    // llama.cpp's gating functions: 1 softmax (the default), 2 sigmoid.
    if let Some(g) = file.get_u64_opt(&key("expert_gating_func")) {
        if g != 1 {
            return Err(EngineError::BadMetadata(format!(
                "expert gating function {g} (pld routes with softmax, 1)"
            )));
        }
    }
    let d_ff = match file.get_u64_opt(&key("expert_feed_forward_length")) {
        Some(ff) => ff as usize,
        None => file.get_u64(&key("feed_forward_length"))? as usize,
    };
    Ok(Some(MoeConfig {
        count,
        used,
        d_ff,
        renormalize: file
            .get_bool_opt(&key("expert_weights_norm"))
            .unwrap_or(true),
    }))
}

#[cfg(test)]
mod tests {
    use super::yarn_factors;

    /// YaRN keeps the fastest pairs' frequencies, divides the slowest by the factor, and blends
    /// in between; rounding the ramp out to whole pairs (`truncate`) moves only the blended ones.
    #[test]
    fn yarn_blends_between_the_correction_pairs() {
        // gpt-oss's settings: base 150000, factor 32 over 4096 positions, beta 32 and 1, 64 dims.
        let exact = yarn_factors(150_000.0, 64, 32.0, 4096.0, (32.0, 1.0), 1.0, false);
        let rounded = yarn_factors(150_000.0, 64, 32.0, 4096.0, (32.0, 1.0), 1.0, true);
        assert_eq!(exact.len(), 32);
        assert_eq!(exact[0], 1.0, "the fastest pair keeps its frequency");
        assert!(
            (exact[31] - 32.0).abs() < 1e-12,
            "the slowest is divided by the factor"
        );
        assert!(exact.windows(2).all(|w| w[0] <= w[1]), "{exact:?}");
        let blended = exact.iter().filter(|&&f| f > 1.0 && f < 32.0).count();
        assert!(blended >= 3, "{exact:?}");
        assert_ne!(exact, rounded);
        assert_eq!(exact[..8], rounded[..8]);
        assert_eq!(exact[24..], rounded[24..]);
    }
}
