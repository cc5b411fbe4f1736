//! What deployment is built from. The Kubernetes manifests in `deploy/kubernetes/`: every object
//! validates against the strict Kubernetes schemas (`deploy/kubernetes/schema/`, made by
//! `scripts/kubernetes-schemas.py`), has what running the binaries safely needs, and configures
//! its binary with settings the binary accepts. The Dockerfile: its Rust image is the workspace's
//! `rust-version`, which every locked dependency of the binaries builds with.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_json::{json, Value};

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes")
}

/// Every object of every manifest, with the file it came from.
fn objects() -> Vec<(String, Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(deploy_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    assert!(files.len() >= 2, "manifests missing: {files:?}");
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let value = Value::deserialize(doc)
                .unwrap_or_else(|e| panic!("{}: not YAML: {e}", file.display()));
            if !value.is_null() {
                out.push((file.file_name().unwrap().to_string_lossy().into(), value));
            }
        }
    }
    out
}

/// A validator for `apiVersion/kind`, or `None` if the schema file has no such kind.
struct Schemas(Value);

impl Schemas {
    fn load() -> Self {
        let text = std::fs::read_to_string(deploy_dir().join("schema/kubernetes-strict.json"))
            .expect("run scripts/kubernetes-schemas.py");
        Self(serde_json::from_str(&text).unwrap())
    }

    fn validator(&self, object: &Value) -> Option<jsonschema::Validator> {
        let key = format!(
            "{}/{}",
            object["apiVersion"].as_str()?,
            object["kind"].as_str()?
        );
        let mut schema = self.0["kinds"].get(&key)?.clone();
        schema["$schema"] = json!("https://json-schema.org/draft/2020-12/schema");
        schema["$defs"] = self.0["$defs"].clone();
        Some(jsonschema::validator_for(&schema).unwrap())
    }

    fn errors(&self, object: &Value) -> Vec<String> {
        let validator = self
            .validator(object)
            .unwrap_or_else(|| panic!("no schema for {} {}", object["apiVersion"], object["kind"]));
        validator
            .iter_errors(object)
            .map(|e| format!("{}: {e}", e.instance_path()))
            .collect()
    }
}

#[test]
fn manifests_validate_against_the_kubernetes_schemas() {
    let schemas = Schemas::load();
    for (file, object) in objects() {
        let errors = schemas.errors(&object);
        assert!(
            errors.is_empty(),
            "{file}: {} {} is invalid:\n{}",
            object["kind"],
            object["metadata"]["name"],
            errors.join("\n")
        );
    }
}

#[test]
fn the_validation_is_strict() {
    let schemas = Schemas::load();
    let (_, deployment) = objects()
        .into_iter()
        .find(|(_, o)| o["kind"] == "Deployment")
        .unwrap();
    assert!(schemas.errors(&deployment).is_empty());
    let mut typo = deployment.clone();
    typo["spec"]["replica"] = json!(2);
    assert!(!schemas.errors(&typo).is_empty(), "unknown field accepted");
    let mut wrong_type = deployment.clone();
    wrong_type["spec"]["replicas"] = json!("two");
    assert!(
        !schemas.errors(&wrong_type).is_empty(),
        "string replicas accepted"
    );
    let mut unnamed = deployment;
    unnamed["spec"]["template"]["spec"]["containers"][0]
        .as_object_mut()
        .unwrap()
        .remove("name");
    assert!(
        !schemas.errors(&unnamed).is_empty(),
        "a container without a name accepted"
    );
}

#[test]
fn manifests_have_what_the_operations_guide_asks_for() {
    let objects = objects();
    let find = |kind: &str, name: &str| {
        objects
            .iter()
            .map(|(_, o)| o)
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
    };
    let proxy = find("Deployment", "lease-proxy");
    assert!(proxy["spec"]["replicas"].as_u64().unwrap() >= 2);
    let pdb = find("PodDisruptionBudget", "lease-proxy");
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        proxy["spec"]["template"]["metadata"]["labels"]
    );
    let gateway = find("StatefulSet", "fence-gateway");
    assert!(
        gateway["spec"]["volumeClaimTemplates"]
            .as_array()
            .is_some_and(|v| !v.is_empty()),
        "the gateway's SQLite marks need a volume"
    );
    for workload in [proxy, gateway] {
        let pod = &workload["spec"]["template"];
        assert_eq!(
            pod["metadata"]["annotations"]["prometheus.io/path"],
            "/metrics"
        );
        for container in pod["spec"]["containers"].as_array().unwrap() {
            assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
            assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/livez");
        }
        // Longer than the shutdown delay, the drain and the span flush, so all end before SIGKILL.
        let grace = pod["spec"]["terminationGracePeriodSeconds"]
            .as_u64()
            .unwrap();
        let container = &pod["spec"]["containers"][0];
        let seconds = |suffix: &str| {
            container["env"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"].as_str().unwrap().ends_with(suffix))
                .and_then(|v| v["value"].as_str()?.strip_suffix('s')?.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no {suffix} in seconds"))
        };
        let (delay, drain) = (seconds("_SHUTDOWN_DELAY"), seconds("_DRAIN_TIMEOUT"));
        let flush = runtime::telemetry::FLUSH_DEADLINE.as_secs();
        assert!(delay > 0, "endpoints need time to drop the pod");
        assert!(
            grace > delay + drain + flush,
            "grace {grace} s ≤ delay {delay} + drain {drain} + span flush {flush} s"
        );
    }
}

/// Each container's command and environment, given to the real binary with `--print-config`:
/// the binary must accept every setting.
#[test]
fn containers_configure_their_binary_with_settings_it_accepts() {
    let mut checked = 0;
    for (file, object) in objects() {
        let Some(containers) = object["spec"]["template"]["spec"]["containers"].as_array() else {
            continue;
        };
        for container in containers {
            let command = container["command"][0].as_str().unwrap();
            let binary = match command {
                "lease-proxy" => PathBuf::from(env!("CARGO_BIN_EXE_lease-proxy")),
                other => lease_proxy_testkit::workspace_binary(other),
            };
            let mut cmd = Command::new(binary);
            cmd.env_clear();
            for arg in container["command"].as_array().unwrap().iter().skip(1) {
                cmd.arg(arg.as_str().unwrap());
            }
            for arg in container["args"].as_array().into_iter().flatten() {
                cmd.arg(arg.as_str().unwrap());
            }
            for var in container["env"].as_array().into_iter().flatten() {
                cmd.env(
                    var["name"].as_str().unwrap(),
                    var["value"].as_str().unwrap_or_default(),
                );
            }
            let out = cmd.arg("--print-config").output().unwrap();
            assert_eq!(
                out.status.code(),
                Some(0),
                "{file}: {command} refuses its settings: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 2, "one container per binary");
}

/// `major.minor` of a Rust version string.
fn minor_version(v: &str) -> (u32, u32) {
    let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap());
    (parts.next().unwrap(), parts.next().unwrap_or(0))
}

#[test]
fn the_dockerfile_rust_image_builds_the_locked_dependencies() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest: toml::Table = std::fs::read_to_string(root.join("Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let declared = manifest["workspace"]["package"]["rust-version"]
        .as_str()
        .unwrap()
        .to_owned();
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).unwrap();
    assert!(
        dockerfile.contains(&format!("FROM rust:{declared}-")),
        "the Dockerfile's build image is not rust:{declared}"
    );
    // What the two binaries are built from, on this platform.
    let tree = Command::new(&cargo)
        .current_dir(&root)
        .args(["tree", "--locked", "--prefix", "none", "-e", "normal,build"])
        .args(["-p", "lease-proxy", "-p", "fencing"])
        .output()
        .unwrap();
    assert!(tree.status.success(), "{tree:?}");
    let built: std::collections::HashSet<(String, String)> = String::from_utf8(tree.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            Some((
                words.next()?.to_owned(),
                words.next()?.trim_start_matches('v').to_owned(),
            ))
        })
        .collect();
    let metadata = Command::new(&cargo)
        .current_dir(&root)
        .args(["metadata", "--locked", "--format-version", "1"])
        .output()
        .unwrap();
    assert!(metadata.status.success(), "{metadata:?}");
    let metadata: Value = serde_json::from_slice(&metadata.stdout).unwrap();
    let mut too_new = Vec::new();
    let mut checked = 0;
    for package in metadata["packages"].as_array().unwrap() {
        let key = (
            package["name"].as_str().unwrap().to_owned(),
            package["version"].as_str().unwrap().to_owned(),
        );
        if !built.contains(&key) {
            continue;
        }
        checked += 1;
        if let Some(needs) = package["rust_version"].as_str() {
            if minor_version(needs) > minor_version(&declared) {
                too_new.push(format!("{} {} needs {needs}", key.0, key.1));
            }
        }
    }
    assert!(checked > 100, "only {checked} packages matched the tree");
    assert!(
        too_new.is_empty(),
        "rust-version {declared} is too old: {}",
        too_new.join(", ")
    );
}
