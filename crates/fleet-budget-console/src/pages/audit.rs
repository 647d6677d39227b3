//! The audit trail, as a table (also on a dependency's page) and as its own page.

use super::*;

pub(super) fn audit_table(trail: &[AuditEntry]) -> Markup {
    html! {
        table.audit {
            thead { tr { th { "when" } th { "who" } th { "action" } th { "dependency" } th { "why" } th { "after" } } }
            tbody {
                @for e in trail.iter().rev() {
                    tr {
                        td { (when(Some(e.at_ms))) }
                        td { (t(&e.actor)) }
                        td { (t(&e.action)) }
                        td { (t(e.dependency.as_deref().unwrap_or("-"))) }
                        td.cut { (short_at(&e.reason, 2048)) }
                        td.json { (short_at(&e.after.as_ref().map(ToString::to_string).unwrap_or_default(), 4096)) }
                    }
                }
            }
        }
    }
}

/// The audit trail.
pub(crate) fn audit(v: &Visitor, trail: &[AuditEntry]) -> Markup {
    layout("Audit trail", Some(v), audit_table(trail))
}
