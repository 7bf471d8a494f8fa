//! Turning one row of logits into the next token: greedy, or sampling from the distribution shaped
//! by repetition penalty, temperature, top-k, top-p and min-p (Hugging Face's order). The
//! distribution is an explicit list of (token, probability) so the verifier can ask for the
//! probability of a drafted token and sample from what remains when it is rejected.

use rand::Rng;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// false: greedy (argmax), the other fields but `repetition_penalty` are ignored.
    pub do_sample: bool,
    pub temperature: f32,
    /// 0 disables top-k.
    pub top_k: usize,
    /// 1.0 disables top-p.
    pub top_p: f32,
    /// 0.0 disables min-p.
    pub min_p: f32,
    /// 1.0 disables the penalty.
    pub repetition_penalty: f32,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            do_sample: false,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
        }
    }
}

/// The most choices one request may ask for (`n`), on every surface.
pub const MAX_CHOICES: usize = 8;

/// The most alternatives per token a request may ask log-probabilities for.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A sampling setting out of range, with the field it concerns (so that an HTTP error can name
/// it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SamplingError {
    pub field: &'static str,
    pub message: String,
}

impl std::fmt::Display for SamplingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl SamplingParams {
    pub fn validate(&self) -> Result<(), SamplingError> {
        let check = |ok: bool, field: &'static str, what: &str, value: f32| {
            if ok {
                Ok(())
            } else {
                Err(SamplingError {
                    field,
                    message: format!("{field} must be {what}, got {value}"),
                })
            }
        };
        let (t, p, m, r) = (
            self.temperature,
            self.top_p,
            self.min_p,
            self.repetition_penalty,
        );
        check(t >= 0.0 && t.is_finite(), "temperature", ">= 0", t)?;
        check(p > 0.0 && p <= 1.0, "top_p", "in (0, 1]", p)?;
        check((0.0..=1.0).contains(&m), "min_p", "in [0, 1]", m)?;
        check(r > 0.0 && r.is_finite(), "repetition_penalty", "> 0", r)
    }

    /// The settings as OpenAI-style APIs give them, checked once for every surface (the server
    /// and the Python bindings): temperature in OpenAI's 0..=2 (the engine itself takes any
    /// temperature >= 0; 0 is greedy), `top_k` -1 or 0 for off, the rest as `validate` checks.
    pub fn from_request(
        temperature: f32,
        top_p: f32,
        top_k: i64,
        min_p: f32,
        repetition_penalty: f32,
    ) -> Result<Self, SamplingError> {
        if !(0.0..=2.0).contains(&temperature) {
            return Err(SamplingError {
                field: "temperature",
                message: format!("temperature must be between 0 and 2, got {temperature}"),
            });
        }
        let top_k = match top_k {
            -1 | 0 => 0,
            k if k > 0 => k as usize,
            k => {
                return Err(SamplingError {
                    field: "top_k",
                    message: format!("top_k must be -1, 0 or positive, got {k}"),
                })
            }
        };
        let params = SamplingParams {
            do_sample: temperature > 0.0,
            temperature,
            top_k,
            top_p,
            min_p,
            repetition_penalty,
        };
        params.validate()?;
        Ok(params)
    }

    /// Sampling at temperature 0 is greedy decoding.
    pub fn is_greedy(&self) -> bool {
        !self.do_sample || self.temperature == 0.0
    }
}

/// Applies the repetition penalty (CTRL / Hugging Face rule: positive logits divided, negative
/// multiplied) once to each distinct token of `context`, in a copy of the row.
fn penalized(logits: &[f32], context: &[u32], penalty: f32) -> Vec<f32> {
    let mut row = logits.to_vec();
    let mut seen: Vec<u32> = context.to_vec();
    seen.sort_unstable();
    seen.dedup();
    for t in seen {
        if let Some(v) = row.get_mut(t as usize) {
            *v = if *v > 0.0 { *v / penalty } else { *v * penalty };
        }
    }
    row
}

/// The first index of the largest value.
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// The greedy choice for this row, `context` being every token before the position.
pub fn greedy(logits: &[f32], context: &[u32], params: &SamplingParams) -> u32 {
    if params.repetition_penalty == 1.0 {
        argmax(logits)
    } else {
        argmax(&penalized(logits, context, params.repetition_penalty))
    }
}

/// A next-token distribution: candidates sorted by decreasing probability, probabilities summing
/// to one.
#[derive(Clone, Debug)]
pub struct Distribution {
    pub candidates: Vec<(u32, f32)>,
}

impl Distribution {
    /// The distribution plain sampling draws from at this position.
    pub fn new(logits: &[f32], context: &[u32], params: &SamplingParams) -> Self {
        let row = if params.repetition_penalty == 1.0 {
            logits.to_vec()
        } else {
            penalized(logits, context, params.repetition_penalty)
        };
        let temp = if params.temperature > 0.0 {
            params.temperature
        } else {
            1.0
        };
        let mut cand: Vec<(u32, f32)> = row
            .iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite())
            .map(|(i, &v)| (i as u32, v / temp))
            .collect();
        if cand.is_empty() {
            return Distribution {
                candidates: vec![(argmax(&row), 1.0)],
            };
        }
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if params.top_k > 0 && params.top_k < cand.len() {
            cand.select_nth_unstable_by(params.top_k - 1, by_logit);
            cand.truncate(params.top_k);
        }
        cand.sort_unstable_by(by_logit);
        // Softmax over what is left.
        let max = cand[0].1;
        let mut sum = 0f64;
        for c in cand.iter_mut() {
            c.1 = (c.1 - max).exp();
            sum += c.1 as f64;
        }
        for c in cand.iter_mut() {
            c.1 = (c.1 as f64 / sum) as f32;
        }
        if params.top_p < 1.0 {
            let mut cum = 0f32;
            let mut keep = cand.len();
            for (i, c) in cand.iter().enumerate() {
                cum += c.1;
                if cum >= params.top_p {
                    keep = i + 1;
                    break;
                }
            }
            cand.truncate(keep.max(1));
        }
        if params.min_p > 0.0 {
            let floor = cand[0].1 * params.min_p;
            let keep = cand.iter().take_while(|c| c.1 >= floor).count();
            cand.truncate(keep.max(1));
        }
        let total: f64 = cand.iter().map(|c| c.1 as f64).sum();
        for c in cand.iter_mut() {
            c.1 = (c.1 as f64 / total) as f32;
        }
        Distribution { candidates: cand }
    }

    pub fn prob(&self, token: u32) -> f32 {
        self.candidates
            .iter()
            .find(|c| c.0 == token)
            .map(|c| c.1)
            .unwrap_or(0.0)
    }

    pub fn sample(&self, rng: &mut impl Rng) -> u32 {
        self.sample_excluding(&[], rng)
    }

    /// Samples with the `excluded` tokens removed and the rest renormalized (the residual
    /// distribution of rejection sampling against point-mass drafts).
    pub fn sample_excluding(&self, excluded: &[u32], rng: &mut impl Rng) -> u32 {
        let mass: f64 = self
            .candidates
            .iter()
            .filter(|c| !excluded.contains(&c.0))
            .map(|c| c.1 as f64)
            .sum();
        if mass <= 0.0 {
            return self.candidates[0].0;
        }
        let mut u = rng.random::<f64>() * mass;
        let mut last = self.candidates[0].0;
        for c in &self.candidates {
            if excluded.contains(&c.0) {
                continue;
            }
            last = c.0;
            u -= c.1 as f64;
            if u < 0.0 {
                return c.0;
            }
        }
        last
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn filters_shape_the_distribution() {
        let logits = [1.0f32, 3.0, 2.0, 0.0, -1.0];
        let p = SamplingParams {
            do_sample: true,
            top_k: 3,
            ..Default::default()
        };
        let d = Distribution::new(&logits, &[], &p);
        let ids: Vec<u32> = d.candidates.iter().map(|c| c.0).collect();
        assert_eq!(ids, vec![1, 2, 0]);
        let sum: f32 = d.candidates.iter().map(|c| c.1).sum();
        assert!((sum - 1.0).abs() < 1e-6);

        let p = SamplingParams {
            do_sample: true,
            top_p: 0.8,
            ..Default::default()
        };
        let d = Distribution::new(&logits, &[], &p);
        // 0.636 alone is below 0.8, with 0.234 it crosses it.
        assert_eq!(d.candidates.len(), 2, "{d:?}");

        let p = SamplingParams {
            do_sample: true,
            min_p: 0.3,
            ..Default::default()
        };
        let d = Distribution::new(&logits, &[], &p);
        assert_eq!(d.candidates.len(), 2, "{d:?}");
    }

    #[test]
    fn repetition_penalty_lowers_seen_tokens() {
        let logits = [2.0f32, 1.9, -1.0];
        let p = SamplingParams {
            repetition_penalty: 1.5,
            ..Default::default()
        };
        assert_eq!(greedy(&logits, &[], &p), 0);
        assert_eq!(greedy(&logits, &[0, 0], &p), 1);
    }

    #[test]
    fn sampling_follows_probabilities() {
        let logits = [0.0f32, (3.0f32).ln(), f32::NEG_INFINITY];
        let p = SamplingParams {
            do_sample: true,
            ..Default::default()
        };
        let d = Distribution::new(&logits, &[], &p);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let n = 20000;
        let ones = (0..n).filter(|_| d.sample(&mut rng) == 1).count();
        let frac = ones as f64 / n as f64;
        assert!((frac - 0.75).abs() < 0.02, "{frac}");
        assert!((0..100).all(|_| d.sample_excluding(&[1], &mut rng) == 0));
    }
}
