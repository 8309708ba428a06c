//! The AWS SQS client: the region, the credentials and the endpoint.
//!
//! Credentials come from the AWS chain (environment, profile, web
//! identity, container or instance role), as every AWS tool reads them.
//! One exception, for local endpoints (moto, ElasticMQ, LocalStack), which
//! accept any key: a plain `http://` endpoint with no `AWS_ACCESS_KEY_ID`
//! in the environment gets a fixed local key instead of a walk through
//! the chain (whose instance-metadata step would stall each cold start).

use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_sqs::config::{Credentials, Region};

/// The region when neither the config nor the AWS chain names one.
const DEFAULT_REGION: &str = "us-east-1";

/// Where and how to reach SQS.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// `None`: AWS's own endpoint for the region.
    pub url: Option<String>,
    pub region: Option<String>,
    pub request_timeout: Duration,
}

impl Endpoint {
    /// The endpoint at `url` (`None`: AWS's own) with the config's default
    /// region and timeout, for tools and tests that have no `[queue]`.
    pub fn at(url: Option<String>) -> Self {
        let defaults = crate::SqsConfig::default();
        Self {
            url,
            region: defaults.region,
            request_timeout: Duration::from_millis(defaults.request_timeout_ms),
        }
    }

    fn is_local(&self) -> bool {
        self.url
            .as_deref()
            .is_some_and(|u| u.starts_with("http://"))
    }

    /// Builds the client. Nothing is sent yet.
    pub async fn client(&self) -> aws_sdk_sqs::Client {
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
        if let Some(region) = &self.region {
            loader = loader.region(Region::new(region.clone()));
        } else if self.is_local() && std::env::var_os("AWS_REGION").is_none() {
            // A local endpoint ignores the region: no walk through the
            // chain (and its instance-metadata step) to find one.
            loader = loader.region(Region::new(DEFAULT_REGION));
        }
        if self.is_local() && std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
            loader = loader.credentials_provider(Credentials::new(
                "breakwater-local",
                "breakwater-local",
                None,
                None,
                "breakwater-local-endpoint",
            ));
        }
        let shared = loader.load().await;
        let mut config = aws_sdk_sqs::config::Builder::from(&shared)
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(self.request_timeout)
                    .operation_attempt_timeout(self.request_timeout)
                    .build(),
            )
            // The SDK's standard retries (with backoff) for throttling and
            // 5xx; a call still failing is the caller's `Unavailable`.
            .retry_config(RetryConfig::standard().with_max_attempts(3));
        if shared.region().is_none() {
            config = config.region(Region::new(DEFAULT_REGION));
        }
        if let Some(url) = &self.url {
            config = config.endpoint_url(url.clone());
        }
        aws_sdk_sqs::Client::from_conf(config.build())
    }
}
