//! Properties of the tool filter and the rights it grants.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use policy::sandbox::{grants, Grants, SandboxRequest};
use policy::toolpolicy::ToolPolicy;
use policy::tools::builtin;
use policy::Audience;
use proptest::prelude::*;

fn names() -> Vec<String> {
    builtin().into_iter().map(|t| t.name).collect()
}

fn subset() -> impl Strategy<Value = Vec<String>> {
    proptest::sample::subsequence(names(), 0..=names().len())
}

fn audience() -> impl Strategy<Value = Audience> {
    prop_oneof![
        Just(Audience::Personal),
        Just(Audience::Team),
        Just(Audience::Public)
    ]
}

fn rights(p: &ToolPolicy, tools: &[String]) -> Grants {
    grants(Some(&p.classes(tools)), &SandboxRequest::default())
}

proptest! {
    #[test]
    fn the_child_holds_a_subset_of_the_parent_and_the_audience(
        a in audience(), parent in subset(), def in proptest::option::of(subset())
    ) {
        let p = ToolPolicy::builtin();
        let child = p.child_tools(a, &parent, def.as_deref()).unwrap();
        let allowed = p.audience_tools(a);
        for t in &child {
            prop_assert!(parent.contains(t));
            prop_assert!(allowed.contains(t));
            if let Some(d) = &def {
                prop_assert!(d.contains(t));
            }
            prop_assert!(p.tool(t).unwrap().class.delegable());
            prop_assert!(!["spawn_agent", "check_agent_run", "attach_file"].contains(&t.as_str()));
        }
    }

    #[test]
    fn filtering_is_idempotent(a in audience(), parent in subset(), def in proptest::option::of(subset())) {
        let p = ToolPolicy::builtin();
        let once = p.child_tools(a, &parent, def.as_deref()).unwrap();
        let twice = p.child_tools(a, &once, def.as_deref()).unwrap();
        prop_assert_eq!(once, twice);
    }

    #[test]
    fn rights_are_monotone_in_the_tools(small in subset(), extra in subset(), req_w in any::<Option<bool>>(), req_n in any::<Option<bool>>()) {
        let p = ToolPolicy::builtin();
        let mut big = small.clone();
        big.extend(extra);
        let request = SandboxRequest { write_project: req_w, network: req_n, ..Default::default() };
        let g_small = grants(Some(&p.classes(&small)), &request);
        let g_big = grants(Some(&p.classes(&big)), &request);
        prop_assert!(g_small.within(&g_big), "{:?} ⊄ {:?}", g_small, g_big);
        // Switches never widen beyond the tools.
        prop_assert!(g_big.within(&rights(&p, &big)));
    }
}
