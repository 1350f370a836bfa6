//! Print every Palisade CRD as YAML: `crdgen` gives `controller/manifests/crds.yaml` (every
//! supported version), `crdgen --cel` gives `controller/manifests/crds-cel.yaml` (1.25+, with
//! CEL rules), `crdgen --reference` gives `docs/reference/resources.md` (every field, from
//! the same schemas).

fn main() -> anyhow::Result<()> {
    let mut cel = false;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--cel" => cel = true,
            "--reference" => {
                print!("{}", palisade_model::reference::resources_markdown());
                return Ok(());
            }
            other => {
                anyhow::bail!("unknown argument {other:?}; usage: crdgen [--cel | --reference]")
            }
        }
    }
    print!("{}", palisade_model::crds_yaml(cel)?);
    Ok(())
}
