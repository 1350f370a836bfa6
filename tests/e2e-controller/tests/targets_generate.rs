//! `kubectl palisade targets generate` output applied to a real Kubernetes 1.34 API server (a
//! control-plane-only lab with the CRDs and their CEL rules): the server's schema and CEL rules
//! accept every generated FenceTarget, with the default template (BMC, then PDU) and with a
//! template that adds a Redfish BMC and a storage level, and store the identity pin as
//! generated.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{client, eventually, rt};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, PostParams};
use kube::Api;
use palisade_lab::KubeVersion;
use palisade_model::FenceTarget;

const WAIT: Duration = Duration::from_secs(60);

fn generate(dir: &std::path::Path, inventory: &str, template: Option<&str>) -> String {
    let bin = palisade_lab::bin_path("kubectl-palisade")
        .expect("build the plugin first: cargo build -p kubectl-palisade");
    std::fs::write(dir.join("nodes.csv"), inventory).unwrap();
    let mut cmd = Command::new(bin);
    cmd.args(["targets", "generate", "-o", "json", "--inventory"])
        .arg(dir.join("nodes.csv"));
    if let Some(t) = template {
        std::fs::write(dir.join("template.yaml"), t).unwrap();
        cmd.arg("--template").arg(dir.join("template.yaml"));
    }
    let out = cmd.output().expect("run kubectl-palisade");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_api_server_accepts_every_generated_fence_target() {
    let lab = common::control_plane_lab(KubeVersion::V1_34);
    let rt = rt();
    let c = client(&lab, &rt);
    let minor = rt.block_on(c.apiserver_version()).expect("/version").minor;
    let minor = palisade_model::parse_minor(&minor).expect("a numeric minor version");
    let crds: Api<CustomResourceDefinition> = Api::all(c.clone());
    for crd in palisade_model::crds_for(minor) {
        rt.block_on(crds.create(&PostParams::default(), &crd))
            .expect("CRD created");
    }
    let api: Api<DynamicObject> = Api::all_with(c.clone(), &ApiResource::erase::<FenceTarget>(&()));
    eventually("FenceTarget served", WAIT, || {
        rt.block_on(api.list(&Default::default())).ok()
    });

    let dir = tempfile_dir();
    let default = generate(
        &dir,
        "node,bmc,system_uuid,pdu,secret\n\
         m1,admin@10.0.20.11,4c4c4544-0037-3010-8052-b4c04f4d3231,pdu-a.mgmt/7,\n\
         m2,admin@10.0.20.12:6230,4c4c4544-0037-3010-8052-b4c04f4d3232,,bmc-m2\n\
         m3,\"redfish+https://fence@10.0.20.13/redfish/v1/Systems/1?ca=secret\",4c4c4544-0037-3010-8052-b4c04f4d3233,\"pdu-b.mgmt:1161/3,4\",\n",
        None,
    );
    let custom = generate(
        &dir,
        "node,bmc,system_uuid,class\n\
         s1,admin@10.0.30.11,4c4c4544-0037-3010-8052-b4c04f4d3241,gold\n",
        Some(
            r#"
levels:
  - name: storage+reset
    powerOff: Disallowed
    devices:
      - url: "storagefw+https://array.mgmt:8443/?profile=lab"
        kind: Storage
        credentialsSecretRef: {name: array, namespace: palisade-system}
        fences: {storageClasses: ["{class}"]}
      - url: "{bmc}"
        kind: Power
        credentialsSecretRef: {name: "{secret}", namespace: palisade-system}
"#,
        ),
    );
    let mut created = 0;
    for out in [default, custom] {
        let list: serde_json::Value = serde_json::from_str(&out).unwrap();
        for item in list["items"].as_array().unwrap() {
            let obj: DynamicObject = serde_json::from_value(item.clone()).unwrap();
            let name = obj.metadata.name.clone().unwrap();
            let pp = PostParams {
                dry_run: false,
                field_manager: Some("palisade-e2e".into()),
            };
            let stored = match rt.block_on(api.create(&pp, &obj)) {
                Ok(o) => o,
                Err(e) => panic!("the API server refused FenceTarget {name}: {e}\n{item:#}"),
            };
            assert_eq!(
                stored.data["spec"], item["spec"],
                "{name} stored as generated"
            );
            let bmc_url = item["spec"]["levels"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|l| l["devices"].as_array().unwrap())
                .filter_map(|d| d["url"].as_str())
                .find(|u| u.starts_with("ipmi://") || u.starts_with("redfish+https://"))
                .unwrap()
                .to_string();
            assert!(
                bmc_url.contains("guid=4c4c4544-") || bmc_url.contains("uuid=4c4c4544-"),
                "{name}: {bmc_url}"
            );
            created += 1;
        }
    }
    assert_eq!(created, 4);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fresh directory for the inventory files.
fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("palisade-targets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
