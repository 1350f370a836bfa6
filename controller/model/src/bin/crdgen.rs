//! Print every Palisade CRD as YAML (the content of `controller/manifests/crds.yaml`).

fn main() -> anyhow::Result<()> {
    print!("{}", palisade_model::crds_yaml()?);
    Ok(())
}
