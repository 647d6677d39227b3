//! The `[metrics]` section: where a worker serves `/metrics` (off unless `listen` is set).

use std::net::SocketAddr;

use serde::Deserialize;

use super::check::Checker;

/// Metrics settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetricsSettings {
    /// Address of the `/metrics` server (e.g. `127.0.0.1:9464`; port 0 picks a free one);
    /// `None` serves nothing. See [`crate::metrics::MetricsServer::from_settings`].
    pub listen: Option<SocketAddr>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMetrics {
    listen: Option<String>,
}

impl RawMetrics {
    /// The settings, an invalid address recorded in `c` (and nothing served).
    pub(super) fn resolve(self, c: &mut Checker) -> MetricsSettings {
        let listen = self
            .listen
            .and_then(|text| match text.parse::<SocketAddr>() {
                Ok(addr) => Some(addr),
                Err(_) => {
                    c.problem(
                        "metrics.listen",
                        format!("{text:?}"),
                        "an IP address and port, such as \"127.0.0.1:9464\" or \"[::]:9464\"",
                    );
                    None
                }
            });
        MetricsSettings { listen }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::problems;
    use crate::Config;

    #[test]
    fn listen_is_an_ip_address_and_port() {
        let c = Config::from_toml("[metrics]\nlisten = \"127.0.0.1:9464\"\n", "x").unwrap();
        assert_eq!(c.metrics.listen, Some("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(Config::from_toml("", "x").unwrap().metrics.listen, None);
        let p = problems("[metrics]\nlisten = \"localhost\"\n");
        assert_eq!(p[0].key, "metrics.listen");
        assert!(p[0].allowed.contains("127.0.0.1:9464"), "{}", p[0]);
    }
}
