import PylonCore

/// A push template stored on its own (`/v1/admin/automation/templates`), which a rule's send
/// step names by id (`{"type": "send", "template": 3}`). Its title, body and data values are
/// `AutomationTemplate`s: `{{profile.NAME}}`, `{{event.NAME}}` (the trigger event's property),
/// `|fallback` for a missing one. A send reads the template's current text.
struct PushTemplate: Equatable {
    var name: String
    var push: AutomationRule.Push

    var json: JSON {
        var p: JSONObject = [
            "name": .string(name), "appId": .string(push.appId), "title": .string(push.title), "body": .string(push.body),
        ]
        p["data"] = .object(push.data)
        return .object(p)
    }

    static func parse(_ j: JSON) throws(AutomationError) -> PushTemplate {
        guard var o = j.objectValue else {
            throw AutomationError("", "a template must be a JSON object {\"name\", \"appId\", \"title\", \"body\", \"data\"?}")
        }
        let name = try AutomationRule.string(o["name"], "name", max: AutomationLimits.maxNameBytes)
        o["name"] = nil
        return PushTemplate(name: name, push: try AutomationRule.push(.object(o), at: ""))
    }
}
