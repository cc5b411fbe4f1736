//! Reading a server's `/metrics` (Prometheus text): the text, and one series' value.

/// The Prometheus text of `{base}/metrics`, fetched with `client` (a TLS client for HTTPS).
pub async fn scrape(client: &reqwest::Client, base: &str) -> String {
    let resp = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {base}/metrics: {e}"));
    resp.text()
        .await
        .unwrap_or_else(|e| panic!("GET {base}/metrics: {e}"))
}

/// The value of the one series of `name` whose labels include every one of `labels`
/// (`outcome="refused"`), or `None` when there is none; panics when several match, naming them.
pub fn series(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    let found: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|l| labels.iter().all(|label| l.contains(label)))
        .collect();
    assert!(
        found.len() <= 1,
        "several series of {name} {labels:?}: {found:?}"
    );
    found.first()?.rsplit(' ').next()?.parse().ok()
}

/// The value of the one series of `name` with `labels` at `{base}/metrics` ([`series`]);
/// panics when there is none, with the text scraped.
pub async fn value(client: &reqwest::Client, base: &str, name: &str, labels: &[&str]) -> f64 {
    let text = scrape(client, base).await;
    series(&text, name, labels).unwrap_or_else(|| panic!("no {name} {labels:?} in:\n{text}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# TYPE r_total counter\n\
        r_total{file=\"tls\",outcome=\"loaded\"} 3\n\
        r_total{file=\"tls\",outcome=\"refused\"} 1\n\
        r_total_other 7\n\
        plain 2\n";

    #[test]
    fn one_series_is_read_by_its_labels() {
        assert_eq!(series(TEXT, "r_total", &["outcome=\"refused\""]), Some(1.0));
        assert_eq!(series(TEXT, "r_total", &["file=\"key\""]), None);
        assert_eq!(series(TEXT, "plain", &[]), Some(2.0));
    }

    #[test]
    #[should_panic(expected = "several series")]
    fn labels_that_name_several_series_are_refused() {
        series(TEXT, "r_total", &["file=\"tls\""]);
    }
}
