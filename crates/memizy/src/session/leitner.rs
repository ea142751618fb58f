//! Learning progress (SPEC 5.1): OQSEP progress records and the host's
//! default scheduler, Leitner boxes 0–4.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The highest Leitner bucket of OQSEP.
pub const MAX_BUCKET: u8 = 4;

/// Days until the next review for each bucket 0..=4: learning (1) the next
/// day, familiar (2) after 3 days, consolidated (3) after a week, mastered
/// (4) after 16 days. Bucket 0 is never the result of an answer.
pub const LEITNER_INTERVAL_DAYS: [u64; 5] = [1, 1, 3, 7, 16];

const DAY_MS: u64 = 24 * 60 * 60 * 1000;

/// `stats` of an OQSEP record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProgressStats {
    #[serde(default)]
    pub attempts: u64,
    #[serde(default)]
    pub incorrect: u64,
    #[serde(default)]
    pub streak: u64,
}

/// `lastAnswer` of an OQSEP record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LastAnswer {
    pub is_correct: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<u8>,
    pub answered_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_spent: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hints_used: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_skipped: Option<bool>,
}

/// One item's OQSEP progress record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProgressRecord {
    pub bucket: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_review_at: Option<String>,
    #[serde(default)]
    pub stats: ProgressStats,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_answer: Option<LastAnswer>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_specific: Option<Value>,
}

/// What a scheduler learns from one `recordAnswer`.
#[derive(Debug, Clone, PartialEq)]
pub struct AnswerOutcome {
    pub is_correct: bool,
    pub confidence: Option<u8>,
    pub time_spent_ms: Option<f64>,
    pub hints_used: Option<f64>,
    pub is_skipped: bool,
}

/// A learning algorithm: the next record from the previous one.
pub trait Scheduler: Send + Sync + std::fmt::Debug {
    /// The OQSEP algorithm id (`leitner`, `sm2`, `fsrs`, …).
    fn algorithm(&self) -> &'static str;
    fn schedule(
        &self,
        previous: Option<&ProgressRecord>,
        outcome: &AnswerOutcome,
        now_ms: u64,
    ) -> ProgressRecord;
}

/// Leitner boxes on OQSEP's bucket scale: 0 is new or reset (never set by
/// an answer, so a bucket of 0 keeps `attempts` at 0, as OQSEP asks), 1 is
/// learning (a wrong answer, from any bucket), 2 familiar (answered
/// correctly at least once), 3 consolidated, 4 mastered. A correct answer
/// moves the item one bucket up, to at least 2 and at most 4; a skip is not
/// an answer (OQSEP: scheduling ignores it): bucket, stats and the next
/// review stay, only `lastAnswer` records it. The next review is the
/// bucket's interval after the answer.
#[derive(Debug, Clone, Copy, Default)]
pub struct Leitner;

/// The bucket of an item answered wrongly: learning.
pub const LEARNING_BUCKET: u8 = 1;
/// The lowest bucket of an item answered correctly: familiar.
pub const FAMILIAR_BUCKET: u8 = 2;

impl Scheduler for Leitner {
    fn algorithm(&self) -> &'static str {
        "leitner"
    }

    fn schedule(
        &self,
        previous: Option<&ProgressRecord>,
        outcome: &AnswerOutcome,
        now_ms: u64,
    ) -> ProgressRecord {
        let old_bucket = previous.map_or(0, |p| p.bucket.min(MAX_BUCKET));
        let mut stats = previous.map(|p| p.stats).unwrap_or_default();
        let last_answer = Some(LastAnswer {
            // OQSEP: a skip's `isCorrect` SHOULD be false.
            is_correct: outcome.is_correct && !outcome.is_skipped,
            confidence: outcome.confidence,
            answered_at: iso8601_utc(now_ms),
            time_spent: outcome.time_spent_ms,
            hints_used: outcome.hints_used,
            is_skipped: outcome.is_skipped.then_some(true),
        });
        let app_specific = previous.and_then(|p| p.app_specific.clone());
        if outcome.is_skipped {
            return ProgressRecord {
                bucket: old_bucket,
                next_review_at: previous.and_then(|p| p.next_review_at.clone()),
                stats,
                last_answer,
                app_specific,
            };
        }
        stats.attempts = stats.attempts.saturating_add(1);
        let bucket = if outcome.is_correct {
            stats.streak = stats.streak.saturating_add(1);
            (old_bucket + 1).clamp(FAMILIAR_BUCKET, MAX_BUCKET)
        } else {
            stats.incorrect = stats.incorrect.saturating_add(1);
            stats.streak = 0;
            LEARNING_BUCKET
        };
        let next = now_ms.saturating_add(LEITNER_INTERVAL_DAYS[usize::from(bucket)] * DAY_MS);
        ProgressRecord {
            bucket,
            next_review_at: Some(iso8601_utc(next)),
            stats,
            last_answer,
            app_specific,
        }
    }
}

/// Milliseconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SS.sssZ`, the
/// form JavaScript's `toISOString` writes.
pub fn iso8601_utc(ms: u64) -> String {
    let days = (ms / DAY_MS) as i64;
    let rem = ms % DAY_MS;
    // Days to a civil date (proleptic Gregorian), after H. Hinnant.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1000 % 60,
        rem % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(is_correct: bool) -> AnswerOutcome {
        AnswerOutcome {
            is_correct,
            confidence: None,
            time_spent_ms: Some(1200.0),
            hints_used: None,
            is_skipped: false,
        }
    }

    #[test]
    fn iso_dates_match_javascript() {
        assert_eq!(iso8601_utc(0), "1970-01-01T00:00:00.000Z");
        // new Date(1764460800123).toISOString()
        assert_eq!(iso8601_utc(1_764_460_800_123), "2025-11-30T00:00:00.123Z");
        assert_eq!(iso8601_utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn buckets_climb_to_four_and_a_wrong_answer_falls_to_learning() {
        let l = Leitner;
        let mut r = l.schedule(None, &outcome(true), 0);
        // Answered correctly once: familiar (OQSEP 2), not new.
        assert_eq!((r.bucket, r.stats.streak), (FAMILIAR_BUCKET, 1));
        for _ in 0..10 {
            r = l.schedule(Some(&r), &outcome(true), 0);
        }
        assert_eq!(r.bucket, MAX_BUCKET);
        assert_eq!(
            r.next_review_at.as_deref(),
            Some("1970-01-17T00:00:00.000Z")
        );
        r = l.schedule(Some(&r), &outcome(false), 0);
        assert_eq!(r.bucket, LEARNING_BUCKET);
        assert_eq!(
            r.stats,
            ProgressStats {
                attempts: 12,
                incorrect: 1,
                streak: 0
            }
        );
        assert_eq!(
            r.next_review_at.as_deref(),
            Some("1970-01-02T00:00:00.000Z")
        );
    }

    #[test]
    fn bucket_zero_only_with_no_attempts() {
        // OQSEP: 0 is new or reset, and then `attempts` SHOULD be 0.
        let l = Leitner;
        let wrong_first = l.schedule(None, &outcome(false), 0);
        assert_eq!(wrong_first.bucket, LEARNING_BUCKET);
        assert_eq!(wrong_first.stats.attempts, 1);
        let skipped = AnswerOutcome {
            is_skipped: true,
            ..outcome(false)
        };
        let skipped_first = l.schedule(None, &skipped, 0);
        assert_eq!((skipped_first.bucket, skipped_first.stats.attempts), (0, 0));
        assert_eq!(skipped_first.next_review_at, None);
        let mut r = None;
        for (i, o) in [true, false, true, true, false, false, true]
            .into_iter()
            .enumerate()
        {
            let out = if i % 3 == 2 {
                skipped.clone()
            } else {
                outcome(o)
            };
            let next = l.schedule(r.as_ref(), &out, 0);
            assert!(next.bucket != 0 || next.stats.attempts == 0, "{next:?}");
            assert!(next.stats.incorrect <= next.stats.attempts);
            r = Some(next);
        }
    }

    #[test]
    fn a_skip_is_not_an_answer() {
        let l = Leitner;
        let r = l.schedule(None, &outcome(true), 0);
        let skipped = AnswerOutcome {
            is_skipped: true,
            ..outcome(true)
        };
        let r2 = l.schedule(Some(&r), &skipped, 5 * DAY_MS);
        assert_eq!((r2.bucket, r2.stats), (r.bucket, r.stats));
        assert_eq!(r2.next_review_at, r.next_review_at);
        let last = r2.last_answer.unwrap();
        assert_eq!((last.is_skipped, last.is_correct), (Some(true), false));
    }
}
