//! The scan that runs before untrusted JSON text is parsed: its nesting
//! depth, and whether it holds numbers that may not fit a double, stepping
//! over string contents. Not a validator: the parse that follows is.
//!
//! The main path reads 64 bytes at a time into bit masks, one bit per byte
//! (quotes, backslashes, brackets, digits), finds the inside of strings with
//! a prefix XOR of the unescaped quotes, and walks single brackets only when
//! the depth could reach a new maximum. The byte-by-byte scan below it is
//! the reference the tests hold it to.

use super::Structure;

/// Digits in a row from which a number may not fit a double.
const LONG_NUMBER_DIGITS: usize = 300;

const BLOCK: usize = 64;

/// One bit per byte of a 64-byte block (bit i is byte i).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Masks {
    quote: u64,
    backslash: u64,
    open: u64,
    close: u64,
    /// `e` or `E`.
    exp: u64,
    /// `.`, `/` or a digit (one range: `/` cannot stand before an `e`
    /// outside a string in valid JSON).
    number: u64,
}

/// Scans JSON text for its nesting depth and for numbers that may not fit
/// a double, stepping over string contents. Stops once `stop_above` is
/// exceeded. For valid JSON the result is exactly that of
/// [`scan_structure_bytewise`].
pub fn scan_structure(text: &[u8], stop_above: usize) -> Structure {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("popcnt")
        && std::is_x86_feature_detected!("bmi1")
    {
        // SAFETY: the CPU has AVX2, POPCNT and BMI1, checked just above.
        return unsafe { scan_avx2(text, stop_above) };
    }
    scan_blocks(text, stop_above, masks)
}

/// The block scan with masks made 32 bytes per compare, and bit counts in
/// one instruction (without POPCNT, `count_ones` is a dozen).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt,bmi1")]
unsafe fn scan_avx2(text: &[u8], stop_above: usize) -> Structure {
    // SAFETY (of the calls): this function only runs where AVX2 is.
    scan_blocks(text, stop_above, |b| unsafe { masks_avx2(b) })
}

#[inline(always)]
fn scan_blocks(text: &[u8], stop_above: usize, masks: impl Fn(&[u8; BLOCK]) -> Masks) -> Structure {
    let mut scan = BlockScan::default();
    let mut blocks = text.chunks_exact(BLOCK);
    for block in &mut blocks {
        let block: &[u8; BLOCK] = block.try_into().expect("a 64-byte chunk");
        match scan.step(masks(block), stop_above) {
            Step::Go => {}
            Step::Exceeded => return scan.out,
            Step::ByteByByte => return scan_structure_bytewise(text, stop_above),
        }
    }
    let rest = blocks.remainder();
    if !rest.is_empty() {
        // Padded with spaces, which none of the masks select.
        let mut last = [b' '; BLOCK];
        last[..rest.len()].copy_from_slice(rest);
        if scan.step(masks(&last), stop_above) == Step::ByteByByte {
            return scan_structure_bytewise(text, stop_above);
        }
    }
    scan.out
}

/// What carries from one block to the next.
#[derive(Default)]
struct BlockScan {
    out: Structure,
    depth: usize,
    /// All ones when the previous block ended inside a string.
    in_string: u64,
    /// 1 when the previous block ended with a backslash that escapes the
    /// next block's first byte.
    escape_carry: u64,
    /// 1 when the previous block ended with a digit or a dot outside
    /// strings.
    number_carry: u64,
}

#[derive(Debug, PartialEq, Eq)]
enum Step {
    Go,
    /// The depth went past the bound: the scan stops.
    Exceeded,
    /// 64 digits (or dots) in a row: a number that long is rare enough
    /// that the byte-by-byte scan counts its digits.
    ByteByByte,
}

impl BlockScan {
    #[inline(always)]
    fn step(&mut self, m: Masks, stop_above: usize) -> Step {
        if m.number == u64::MAX {
            return Step::ByteByByte;
        }
        let quotes = m.quote & !self.escaped(m.backslash);
        let inside = prefix_xor(quotes) ^ self.in_string;
        // The top bit says whether the block ends inside a string.
        self.in_string = ((inside as i64) >> 63) as u64;
        let outside = !inside;

        // An exponent follows a digit or a decimal point; the `e` of `true`
        // and `false` follows a letter.
        let number = m.number & outside;
        if m.exp & outside & ((number << 1) | self.number_carry) != 0 {
            self.out.big_numbers = true;
        }
        self.number_carry = number >> 63;

        let opens = m.open & outside;
        let closes = m.close & outside;
        if opens | closes == 0 {
            return Step::Go;
        }
        let (n_open, n_close) = (opens.count_ones() as usize, closes.count_ones() as usize);
        if self.depth + n_open <= self.out.max_depth && self.depth >= n_close {
            // No new maximum is possible in this block.
            self.depth = self.depth + n_open - n_close;
            return Step::Go;
        }
        let mut brackets = opens | closes;
        while brackets != 0 {
            let bit = brackets & brackets.wrapping_neg();
            if opens & bit != 0 {
                self.depth += 1;
                if self.depth > self.out.max_depth {
                    self.out.max_depth = self.depth;
                    if self.depth > stop_above {
                        return Step::Exceeded;
                    }
                }
            } else {
                self.depth = self.depth.saturating_sub(1);
            }
            brackets ^= bit;
        }
        Step::Go
    }

    /// The bytes escaped by a backslash. Backslashes are rare, so they are
    /// walked one by one; a backslash escaped by another escapes nothing.
    fn escaped(&mut self, backslash: u64) -> u64 {
        if backslash | self.escape_carry == 0 {
            return 0;
        }
        let mut escaped = self.escape_carry;
        let mut left = backslash & !self.escape_carry;
        self.escape_carry = 0;
        while left != 0 {
            let i = left.trailing_zeros();
            if i == 63 {
                self.escape_carry = 1;
                break;
            }
            escaped |= 1 << (i + 1);
            left &= !(0b11 << i);
        }
        escaped
    }
}

/// Bit i becomes the XOR of bits 0..=i: between an opening quote
/// (included) and its closing quote (excluded), bits are set.
fn prefix_xor(mut x: u64) -> u64 {
    x ^= x << 1;
    x ^= x << 2;
    x ^= x << 4;
    x ^= x << 8;
    x ^= x << 16;
    x ^= x << 32;
    x
}

/// The masks of one block, 16 bytes per SSE2 compare.
#[cfg(target_arch = "x86_64")]
fn masks(block: &[u8; BLOCK]) -> Masks {
    use std::arch::x86_64::*;
    let mut m = Masks::default();
    for k in 0..BLOCK / 16 {
        // SAFETY: SSE2 is part of every x86-64 CPU, so these intrinsics are
        // always available; the load reads bytes k*16 .. k*16+16, within
        // the 64-byte block, and an unaligned load needs no alignment.
        unsafe {
            let v = _mm_loadu_si128(block.as_ptr().add(k * 16).cast::<__m128i>());
            // `[`/`{`, `]`/`}` and `e`/`E` differ only in bit 0x20.
            let folded = _mm_or_si128(v, _mm_set1_epi8(0x20));
            // '.'..='9' moved to -128..=-117: one signed compare.
            let shifted = _mm_add_epi8(v, _mm_set1_epi8(0x52));
            let lanes = [
                _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8)),
                _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8)),
                _mm_cmpeq_epi8(folded, _mm_set1_epi8(b'{' as i8)),
                _mm_cmpeq_epi8(folded, _mm_set1_epi8(b'}' as i8)),
                _mm_cmpeq_epi8(folded, _mm_set1_epi8(b'e' as i8)),
                _mm_cmplt_epi8(shifted, _mm_set1_epi8(-116)),
            ];
            let bits = lanes.map(|x| u64::from(_mm_movemask_epi8(x) as u16) << (k * 16));
            m.quote |= bits[0];
            m.backslash |= bits[1];
            m.open |= bits[2];
            m.close |= bits[3];
            m.exp |= bits[4];
            m.number |= bits[5];
        }
    }
    m
}

/// The masks of one block, 32 bytes per AVX2 compare.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn masks_avx2(block: &[u8; BLOCK]) -> Masks {
    use std::arch::x86_64::*;
    let mut m = Masks::default();
    for k in 0..BLOCK / 32 {
        // SAFETY: bytes k*32 .. k*32+32 lie within the 64-byte block, and
        // an unaligned load needs no alignment.
        let v = unsafe { _mm256_loadu_si256(block.as_ptr().add(k * 32).cast::<__m256i>()) };
        let folded = _mm256_or_si256(v, _mm256_set1_epi8(0x20));
        let bits = |x: __m256i| u64::from(_mm256_movemask_epi8(x) as u32) << (k * 32);
        m.quote |= bits(_mm256_cmpeq_epi8(v, _mm256_set1_epi8(b'"' as i8)));
        m.backslash |= bits(_mm256_cmpeq_epi8(v, _mm256_set1_epi8(b'\\' as i8)));
        m.open |= bits(_mm256_cmpeq_epi8(folded, _mm256_set1_epi8(b'{' as i8)));
        m.close |= bits(_mm256_cmpeq_epi8(folded, _mm256_set1_epi8(b'}' as i8)));
        m.exp |= bits(_mm256_cmpeq_epi8(folded, _mm256_set1_epi8(b'e' as i8)));
        // '.'..='9' moved to -128..=-117: one signed compare.
        let shifted = _mm256_add_epi8(v, _mm256_set1_epi8(0x52));
        m.number |= bits(_mm256_cmpgt_epi8(_mm256_set1_epi8(-116), shifted));
    }
    m
}

#[cfg(not(target_arch = "x86_64"))]
fn masks(block: &[u8; BLOCK]) -> Masks {
    masks_bytewise(block)
}

/// The masks byte by byte: other targets, and the oracle of the tests.
#[cfg(any(test, not(target_arch = "x86_64")))]
fn masks_bytewise(block: &[u8; BLOCK]) -> Masks {
    let mut m = Masks::default();
    for (i, &b) in block.iter().enumerate() {
        let bit = 1u64 << i;
        match b {
            b'"' => m.quote |= bit,
            b'\\' => m.backslash |= bit,
            b'[' | b'{' => m.open |= bit,
            b']' | b'}' => m.close |= bit,
            b'e' | b'E' => m.exp |= bit,
            b'.'..=b'9' => m.number |= bit,
            _ => {}
        }
    }
    m
}

/// Byte classes of the scan: everything else is 0.
const QUOTE: u8 = 1;
const OPEN: u8 = 2;
const CLOSE: u8 = 3;
const DIGIT: u8 = 4;
const EXP: u8 = 5;
const DOT: u8 = 6;

const CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    t[b'"' as usize] = QUOTE;
    t[b'[' as usize] = OPEN;
    t[b'{' as usize] = OPEN;
    t[b']' as usize] = CLOSE;
    t[b'}' as usize] = CLOSE;
    let mut d = b'0';
    while d <= b'9' {
        t[d as usize] = DIGIT;
        d += 1;
    }
    t[b'e' as usize] = EXP;
    t[b'E' as usize] = EXP;
    t[b'.' as usize] = DOT;
    t
};

/// Strings shorter than this are stepped over byte by byte; longer ones
/// with memchr (its set-up costs more than a short loop).
const SHORT_STRING: usize = 32;

/// The same scan byte by byte: the reference the block scan is tested
/// against, and the path for targets without SSE2.
pub fn scan_structure_bytewise(text: &[u8], stop_above: usize) -> Structure {
    let mut depth = 0usize;
    let mut out = Structure::default();
    let mut digits = 0usize;
    let mut prev = 0u8;
    let mut i = 0usize;
    let n = text.len();
    while i < n {
        let class = CLASS[text[i] as usize];
        if class == DIGIT {
            digits += 1;
            if digits >= LONG_NUMBER_DIGITS {
                out.big_numbers = true;
            }
            prev = DIGIT;
            i += 1;
            continue;
        }
        digits = 0;
        match class {
            QUOTE => {
                i += 1;
                // To the closing quote, stepping over escapes.
                loop {
                    let end = (i + SHORT_STRING).min(n);
                    let mut j = i;
                    while j < end && text[j] != b'"' && text[j] != b'\\' {
                        j += 1;
                    }
                    if j == end && end < n {
                        match memchr::memchr2(b'"', b'\\', &text[end..]) {
                            Some(k) => j = end + k,
                            None => return out,
                        }
                    }
                    if j >= n {
                        return out;
                    }
                    if text[j] == b'\\' {
                        i = j + 2;
                        if i >= n {
                            return out;
                        }
                    } else {
                        i = j + 1;
                        break;
                    }
                }
                prev = QUOTE;
                continue;
            }
            OPEN => {
                depth += 1;
                if depth > out.max_depth {
                    out.max_depth = depth;
                    if depth > stop_above {
                        return out;
                    }
                }
            }
            CLOSE => depth = depth.saturating_sub(1),
            // An exponent follows a digit or a decimal point; the `e` of
            // `true` and `false` follows a letter.
            EXP if prev == DIGIT || prev == DOT => out.big_numbers = true,
            _ => {}
        }
        prev = class;
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn both(text: &str, stop_above: usize) -> Structure {
        let fast = scan_structure(text.as_bytes(), stop_above);
        assert_eq!(
            fast,
            scan_structure_bytewise(text.as_bytes(), stop_above),
            "{text}"
        );
        fast
    }

    #[test]
    fn strings_escapes_and_numbers_across_block_boundaries() {
        for pad in 0..70 {
            let p = " ".repeat(pad);
            // A string with brackets and an escaped quote, cut anywhere.
            let s = both(&format!(r#"{p}[["a[[\"[{{", 1]]"#), 100);
            assert_eq!(s.max_depth, 2);
            // Runs of backslashes: an even run ends the escape.
            let s = both(&format!(r#"{p}["\\\\", [[1]]]"#), 100);
            assert_eq!(s.max_depth, 3);
            let s = both(&format!(r#"{p}["\\\"]]]", [1]]"#), 100);
            assert_eq!(s.max_depth, 2);
            // An exponent just after a boundary.
            assert!(both(&format!("{p}[1.5e3]"), 100).big_numbers);
            assert!(both(&format!("{p}[1.E3]"), 100).big_numbers);
            assert!(!both(&format!(r#"{p}[true, false, "1e9"]"#), 100).big_numbers);
            // 300 digits in a row, and 299.
            assert!(both(&format!("{p}[{}]", "7".repeat(300)), 100).big_numbers);
            assert!(!both(&format!("{p}[{}]", "7".repeat(299)), 100).big_numbers);
            assert!(!both(&format!(r#"{p}["{}"]"#, "7".repeat(400)), 100).big_numbers);
            // Stopping once the bound is passed.
            let deep = format!("{p}{}{}", "[".repeat(70), "]".repeat(70));
            assert_eq!(both(&deep, 64).max_depth, 65);
            assert_eq!(both(&deep, 100).max_depth, 70);
        }
    }

    proptest! {
        #[test]
        #[cfg(target_arch = "x86_64")]
        fn avx2_masks_match_byte_masks(block in proptest::array::uniform32(any::<u8>()), other in proptest::array::uniform32(any::<u8>())) {
            if std::is_x86_feature_detected!("avx2") {
                let mut b = [0u8; BLOCK];
                b[..32].copy_from_slice(&block);
                b[32..].copy_from_slice(&other);
                // SAFETY: AVX2 was detected.
                prop_assert_eq!(unsafe { masks_avx2(&b) }, masks_bytewise(&b));
            }
        }

        /// The SSE2 path, whichever one `scan_structure` takes here.
        #[test]
        fn the_sse2_scan_agrees_with_the_byte_scan(v in arb_value(), stop in 0usize..8) {
            let text = v.to_string();
            let fast = scan_blocks(text.as_bytes(), stop, masks);
            let slow = scan_structure_bytewise(text.as_bytes(), stop);
            prop_assert_eq!(fast.max_depth, slow.max_depth);
            if slow.max_depth <= stop {
                prop_assert_eq!(fast.big_numbers, slow.big_numbers);
            }
        }

        #[test]
        fn block_masks_match_byte_masks(block in proptest::array::uniform32(any::<u8>()), other in proptest::array::uniform32(any::<u8>())) {
            let mut b = [0u8; BLOCK];
            b[..32].copy_from_slice(&block);
            b[32..].copy_from_slice(&other);
            prop_assert_eq!(masks(&b), masks_bytewise(&b));
        }

        /// On any text serde accepts as JSON, the two scans agree.
        #[test]
        fn the_block_scan_agrees_with_the_byte_scan(
            text in r#"[\[\]{}"\\0-9eE.,: a-]{0,200}"#,
            stop in 0usize..12,
        ) {
            if serde_json::from_str::<serde::de::IgnoredAny>(&text).is_ok() {
                let fast = scan_structure(text.as_bytes(), stop);
                let slow = scan_structure_bytewise(text.as_bytes(), stop);
                prop_assert_eq!(fast.max_depth, slow.max_depth);
                if slow.max_depth <= stop {
                    prop_assert_eq!(fast.big_numbers, slow.big_numbers);
                }
            }
        }

        #[test]
        fn the_block_scan_agrees_on_generated_json(v in arb_value(), pretty in any::<bool>(), stop in 0usize..8) {
            let text = if pretty { serde_json::to_string_pretty(&v).unwrap() } else { v.to_string() };
            let fast = scan_structure(text.as_bytes(), stop);
            let slow = scan_structure_bytewise(text.as_bytes(), stop);
            prop_assert_eq!(fast.max_depth, slow.max_depth);
            if slow.max_depth <= stop {
                prop_assert_eq!(fast.big_numbers, slow.big_numbers);
            }
        }
    }

    fn arb_value() -> impl Strategy<Value = serde_json::Value> {
        use serde_json::Value;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            r#"[a-z\\"\[\]{}0-9eE. ]{0,90}"#.prop_map(Value::String),
        ];
        leaf.prop_recursive(5, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map("[a-z\\\"]{0,6}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }
}
