//! Published data replays: for every run in the committed campaign data (`campaign/data/*.json`),
//! generating the plan from its seed and settings gives exactly the schedule the run recorded,
//! and the faults it logged are exactly the planned ones.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use lease_proxy_campaign::cluster::{Control, Faults, Marks, Shape};
use lease_proxy_campaign::nemesis::Fault;
use lease_proxy_campaign::plan::{Parts, Plan};

#[test]
fn committed_seeds_reproduce_their_schedules() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("campaign/data") {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let runs: Vec<serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for run in runs {
            let seed = run["seed"].as_u64().unwrap();
            let control: Control = serde_json::from_value(run["control"].clone()).unwrap();
            let chaos = Duration::from_millis(
                run["duration_ms"].as_u64().unwrap() - run["final_phase_ms"].as_u64().unwrap(),
            );
            let recorded: Plan = serde_json::from_value(run["plan"].clone()).unwrap();
            let marks: Marks = serde_json::from_value(run["marks"].clone()).unwrap();
            let faults: Faults = run
                .get("faults_drawn")
                .map_or(Faults::All, |f| serde_json::from_value(f.clone()).unwrap());
            let shape = Shape {
                control,
                seed,
                processing: (Duration::ZERO, Duration::ZERO),
                marks,
                faults,
            };
            let parts = Parts {
                gateway: shape.gateways() > 0,
                postgres: shape.on_postgres(),
            };
            let plan = match (marks, faults) {
                (Marks::InDatabase, _) => Plan::in_database(seed, chaos),
                (_, Faults::All) => Plan::generate(seed, chaos, parts),
                (_, Faults::PausedAdmissions) => Plan::paused_admissions(seed, chaos),
            };
            let plan = match run["fleet"]["shape"]["members"].as_u64() {
                Some(members) => plan.with_fleet(chaos, usize::try_from(members).unwrap()),
                None => plan,
            };
            assert_eq!(plan, recorded, "{}: seed {seed}", path.display());

            let mut planned: BTreeMap<Fault, u64> = BTreeMap::new();
            for step in plan
                .infrastructure
                .iter()
                .chain(&plan.clients)
                .chain(&plan.fleet)
            {
                *planned.entry(step.fault).or_default() += 1;
            }
            let logged: BTreeMap<Fault, u64> =
                serde_json::from_value(run["faults"].clone()).unwrap();
            assert_eq!(planned, logged, "{}: seed {seed}", path.display());
            checked += 1;
        }
    }
    eprintln!("{checked} committed runs replayed");
    assert!(
        checked > 0,
        "no committed campaign data in {}",
        dir.display()
    );
}

/// Every figure in docs/RELIABILITY.md is traceable: the rendering of each committed data file
/// appears there verbatim (`./scripts/campaign.sh doc` writes it).
#[test]
fn the_published_tables_are_the_committed_data() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(root.join("../docs/RELIABILITY.md")).unwrap();
    let mut checked = 0;
    for entry in std::fs::read_dir(root.join("data")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let runs: Vec<lease_proxy_campaign::run::Report> =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let rendered = lease_proxy_campaign::report::markdown(&runs);
        assert!(
            page.contains(&rendered),
            "docs/RELIABILITY.md does not show {} as rendered (run ./scripts/campaign.sh doc)",
            path.display()
        );
        checked += 1;
    }
    assert!(checked > 0);
}
