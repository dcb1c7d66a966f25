import PylonCore

/// The audit log entries of the data API's changes (erasures, sends and scheduled sends,
/// settings, retention), written through the console's audit log (`audit`,
/// `Backend+Admin.swift`).
extension Backend {
    /// Writes a change to the audit log (a failure is logged, the change stands).
    func recordChange(_ principal: Principal, _ action: String, target: String, detail: JSONObject = [:]) {
        audit(principal, action, target: target, detail: .object(detail))
    }

    /// The name the audit log and the push history give the caller.
    func actorName(_ principal: Principal) -> String { principal.actor }
}
