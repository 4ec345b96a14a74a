//! The capacity figures in the table and the JSON: the raw-pipeline floor with the pipeline's
//! ratio to it, and the steady rates with a bounded backlog.

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::figures::Figures;
use crate::steady;
use crate::sustain::{self, Verdict};

/// The pipeline's sustained rate over the floor's, when both were measured.
pub(super) fn ratio(figures: &Figures) -> Option<f64> {
    let floor = sustain::sustained(&figures.floor);
    let pipeline = sustain::sustained(&figures.pipeline);
    (floor > 0.0 && pipeline > 0.0).then(|| pipeline / floor)
}

fn probes<P: Verdict>(t: &mut String, probes: &[P], kept: &str, behind: &str, extra: impl Fn(&P) -> String) {
    for p in probes {
        let _ = writeln!(
            t,
            "  probe    {:>7.1}/s offered  {:>7.1}/s through  {}: {}",
            p.offered(),
            p.delivered_per_second(),
            extra(p),
            if p.kept_up() { kept } else { behind }
        );
    }
}

/// The capacity section of the table (empty when no capacity phase ran).
pub(super) fn table(f: &Figures) -> String {
    let mut t = String::new();
    if !f.floor.is_empty() {
        let _ = writeln!(
            t,
            "\nraw-pipeline floor (plain SQL writes, claim+produce+mark, bare consumer; no Idempost code): {:.0}/s sustained",
            sustain::sustained(&f.floor)
        );
        probes(&mut t, &f.floor, "kept up", "fell behind", |p| {
            format!("({} written, {} failed)", p.sent, p.failed)
        });
        if let Some(r) = ratio(f) {
            let _ = writeln!(t, "  pipeline sustained / floor sustained = {r:.2}");
        }
    }
    let sections = [
        ("relay alone (plain SQL writes, one idempost-relay)", &f.steady_relay),
        ("whole pipeline", &f.steady_pipeline),
    ];
    for (what, search) in sections {
        if search.is_empty() {
            continue;
        }
        let _ = writeln!(
            t,
            "\nsteady rate with a bounded backlog (grows <= {:.0}/s over each probe), {what}: {:.0}/s",
            steady::MAX_GROWTH,
            sustain::sustained(search)
        );
        probes(&mut t, search, "steady", "growing", |p| {
            format!("backlog {:+.0}/s ({} written, {} failed)", p.growth_per_second(), p.sent, p.failed)
        });
    }
    t
}

/// The capacity figures as JSON.
pub(super) fn json(f: &Figures) -> Value {
    let steady = |search: &[steady::Probe]| {
        json!({
            "perSecond": sustain::sustained(search),
            "probes": search.iter().map(|p| json!({
                "offeredPerSecond": p.offered, "written": p.sent, "failed": p.failed,
                "backlogGrowthPerSecond": p.growth_per_second(), "steady": p.kept_up()})).collect::<Vec<_>>(),
        })
    };
    json!({
        "floor": {
            "sustainedPerSecond": sustain::sustained(&f.floor),
            "pipelineOverFloor": ratio(f),
            "probes": f.floor.iter().map(|p| json!({
                "offeredPerSecond": p.offered, "written": p.sent, "failed": p.failed,
                "consumedMeanwhilePerSecond": p.delivered_per_second(), "keptUp": p.kept_up()})).collect::<Vec<_>>(),
        },
        "steadyRelayAlone": steady(&f.steady_relay),
        "steadyPipeline": steady(&f.steady_pipeline),
    })
}
