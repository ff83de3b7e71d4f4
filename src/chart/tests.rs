use super::*;
use crate::modules::{ChartRow, MODULES, Pods};

const FILE: &str = "manifests/helm/csi-sidecar/files/modules.yaml";

/// The chart's file of modules is the table's rendering; with
/// `UPDATE_EXPECT=1` the test writes it instead.
#[test]
fn the_charts_module_file_is_the_rows() {
    let rows: Vec<&ModuleDesc> = MODULES.iter().collect();
    let want = render(&rows);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(FILE);
    if std::env::var_os("UPDATE_EXPECT").is_some() {
        std::fs::write(&path, &want).expect("write the chart's file of modules");
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(have == want, "{FILE} is stale: run `UPDATE_EXPECT=1 cargo test --lib chart::`");
}

/// Each pod lists its rows in table order, with every fact the templates
/// read; a Secrets rule is marked, a value rule names its value.
#[test]
fn a_row_renders_with_its_names_needs_and_rules() {
    const GADGETS: &[(&str, Rule)] = &[("watchGadgets", Rule::new(&["example.com"], &["gadgets"], &["watch"]))];
    const WIDGETS: &[Rule] = &[
        Rule::new(&["example.com"], &["widgets", "widgets/status"], &["get", "patch"]),
        Rule::new(&[""], &["secrets"], &["get"]),
    ];
    let row = ModuleDesc {
        name: "widgeter",
        binary_names: &["csi-widgeter"],
        chart: ChartRow {
            values_key: "widgeter",
            pods: Pods { controller: true, node: true },
            container: "csi-widgeter",
            port_name: "widgets",
            port: 8099,
            value_rules: GADGETS,
        },
        kinds: &["Widget"],
        cluster_rules: WIDGETS,
        ..*crate::modules::lookup("attacher").expect("attacher row")
    };
    let text = render(&[&row]);
    let entry = "  - name: \"widgeter\"\n    values: \"widgeter\"\n    container: \"csi-widgeter\"\n    \
                 command: \"/csi-widgeter\"\n    portName: \"widgets\"\n    leader: true\n    registration: false\n    \
                 kinds: [\"Widget\"]\n    rules:\n      \
                 - {apiGroups: [\"example.com\"], resources: [\"widgets\", \"widgets/status\"], verbs: [\"get\", \"patch\"]}\n      \
                 - {apiGroups: [\"\"], resources: [\"secrets\"], verbs: [\"get\"], secrets: true}\n    \
                 valueRules:\n      \
                 - {apiGroups: [\"example.com\"], resources: [\"gadgets\"], verbs: [\"watch\"], value: \"watchGadgets\"}\n";
    let body = text.lines().skip_while(|l| l.starts_with('#')).collect::<Vec<_>>().join("\n") + "\n";
    assert_eq!(body, format!("controller:\n{entry}node:\n{entry}"));
}
