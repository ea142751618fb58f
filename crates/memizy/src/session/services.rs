//! The services a host offers (SPEC 5.3). A call reaches a service only
//! when the plugin declared it and the host offers it; the host runs it
//! (over worker RPC) and answers within the service's time.

use std::collections::BTreeMap;

/// How long a service may take before its call fails, unless the
/// registry says otherwise.
pub const DEFAULT_SERVICE_TIMEOUT_MS: u64 = 10_000;

/// One offered service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceSpec {
    pub timeout_ms: u64,
}

impl Default for ServiceSpec {
    fn default() -> Self {
        Self {
            timeout_ms: DEFAULT_SERVICE_TIMEOUT_MS,
        }
    }
}

/// The services this host offers, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceRegistry {
    offered: BTreeMap<String, ServiceSpec>,
}

impl ServiceRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Offers `name` (a SPEC service name such as `chess.puzzles`).
    pub fn offer(mut self, name: impl Into<String>, spec: ServiceSpec) -> Self {
        self.offered.insert(name.into(), spec);
        self
    }

    pub fn get(&self, name: &str) -> Option<&ServiceSpec> {
        self.offered.get(name)
    }

    /// `InitPayload.services`: declared by the plugin and offered here, in
    /// the plugin's order, each once.
    pub fn available_to(&self, declared: &[String]) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for name in declared {
            if self.offered.contains_key(name) && !out.contains(name) {
                out.push(name.clone());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_declared_and_offered_services_are_available() {
        let r = ServiceRegistry::new()
            .offer("chess.puzzles", ServiceSpec::default())
            .offer("tts", ServiceSpec { timeout_ms: 5 });
        let declared = vec![
            "ai.chat".to_owned(),
            "chess.puzzles".to_owned(),
            "chess.puzzles".to_owned(),
        ];
        assert_eq!(r.available_to(&declared), vec!["chess.puzzles".to_owned()]);
        assert_eq!(r.get("tts").map(|s| s.timeout_ms), Some(5));
    }
}
