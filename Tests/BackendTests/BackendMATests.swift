import Foundation
import PylonClientKit
import PylonStore
import TestSupport
import Testing

/// The backend's MA API as a black box (the real binary): identity resolution, contacts,
/// channel values, user properties with server metadata, the AppKey gate and inspection.
@Suite(.serialized) struct BackendMATests {
    // MARK: Identity

    @Test(arguments: StoreKind.allCases) func startBindsTheDeviceToOneUser(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        let r = try b.ma("start", ["deviceId": "d1"])
        #expect(r["code"] == 0)
        #expect(r["project"] == "default")
        let e = try #require(r["euid"]?.stringValue)
        #expect(e.count == 32 && e.allSatisfy(\.isHexDigit))
        #expect(try b.ma("start", ["deviceId": "d1"])["euid"] == .string(e))
        let other = try b.startEUID("d2")
        #expect(other != e)
        #expect(try b.findUser("deviceId=d1") == .string(e))
        #expect(try b.findUser("deviceId=nope") == .null)
        let u = try b.user(e)
        #expect(u["identities"] == ["user_id": .null, "anonymous_id": .null, "emails": [], "phones": [], "devices": ["d1"]])
        #expect(u["contacts"] == [:] as JSON)
        #expect(u["properties"] == [:] as JSON)
        #expect(u["channels"] == [])
        // AppKeys are separate graphs.
        #expect(try b.startEUID("d1", app: "other.app") != e)
    }

    @Test(arguments: StoreKind.allCases) func userIDOutranksAnonymousIDWhichOutranksTheDevice(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        // A device's user takes an anonymous_id, then a user_id, as it has neither.
        let e0 = try b.startEUID("d1")
        #expect(try b.identify("d1", e0, ["anonymous_id": "a1"])["euid"] == .string(e0))
        #expect(try b.identify("d1", e0, ["user_id": "u1"])["euid"] == .string(e0))
        #expect(try b.user(e0)["identities"]?["user_id"] == "u1")
        #expect(try b.user(e0)["identities"]?["anonymous_id"] == "a1")

        // Another device: the anonymous_id's holder wins over the device's own user, and the
        // device moves to it.
        let e2 = try b.startEUID("d2")
        #expect(e2 != e0)
        let moved = try b.identify("d2", e2, ["anonymous_id": "a1"])
        #expect(moved == ["code": 0, "euid": .string(e0), "fields": ["anonymous_id": ["code": 0]]])
        #expect(try b.findUser("deviceId=d2") == .string(e0))
        #expect(try b.user(e0)["identities"]?["devices"] == ["d1", "d2"])

        // Start with an identity resolves the same way.
        #expect(try b.ma("start", ["deviceId": "d3", "identity": ["user_id": "u1"]])["euid"] == .string(e0))

        // user_id outranks anonymous_id: X holds u2, Y holds a2; both sent → X, a2 is Y's.
        let x = try b.startEUID("dx")
        _ = try b.identify("dx", x, ["user_id": "u2"])
        let y = try b.startEUID("dy")
        _ = try b.identify("dy", y, ["anonymous_id": "a2"])
        let both = try b.identify("dz", nil, ["user_id": "u2", "anonymous_id": "a2"])
        #expect(both["euid"] == .string(x))
        #expect(both["fields"]?["user_id"] == ["code": 0])
        #expect(both["fields"]?["anonymous_id"]?["code"] == 3101)
        #expect(try b.findUser("anonymous_id=a2") == .string(y))

        // The resolved user already has another anonymous_id: 3102, not attached.
        let conflict = try b.identify("d1", e0, ["user_id": "u1", "anonymous_id": "a9"])
        #expect(conflict["euid"] == .string(e0))
        #expect(conflict["fields"]?["anonymous_id"]?["code"] == 3102)
        #expect(try b.findUser("anonymous_id=a9") == .null)

        // A current user that already has a user_id: a new user_id makes a new user.
        let fresh = try b.identify("d1", e0, ["user_id": "u3"])
        let e3 = try #require(fresh["euid"]?.stringValue)
        #expect(e3 != e0)
        #expect(try b.findUser("user_id=u3") == .string(e3))
        #expect(try b.findUser("deviceId=d1") == .string(e3))
        // An unknown euid counts as none: the device's user is current.
        let unknown = try b.identify("d1", "0123456789abcdef0123456789abcdef", ["anonymous_id": "a3"])
        #expect(unknown["euid"] == .string(e3))
    }

    @Test(arguments: StoreKind.allCases) func emailMatchingYieldsTheOtherUsersEUID(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        let a = try b.startEUID("d1")
        let r1 = try b.identify("d1", a, ["email": "Ann@Example.COM"])
        #expect(r1 == ["code": 0, "euid": .string(a), "fields": ["email": ["code": 0]]])
        #expect(try b.user(a)["identities"]?["emails"] == ["ann@example.com"])
        #expect(try b.findUser("email=ANN@example.com") == .string(a))

        let other = try b.startEUID("d2")
        let r2 = try b.identify("d2", other, ["email": "ann@EXAMPLE.com", "phone": "+8613800000000"])
        #expect(r2["euid"] == .string(a))
        #expect(r2["fields"] == ["email": ["code": 0], "phone": ["code": 0]])
        #expect(try b.user(a)["identities"]?["phones"] == ["+8613800000000"])

        // Email and phone held by different users: the email's holder wins, the phone is 3101.
        let c = try b.startEUID("d3")
        _ = try b.identify("d3", c, ["phone": "+441234567"])
        let r3 = try b.identify("d4", nil, ["email": "ann@example.com", "phone": "+441234567"])
        #expect(r3["euid"] == .string(a))
        #expect(r3["fields"]?["phone"] == ["code": 3101, "msg": "identifier belongs to another user"])
        // A free email is attached to the current user.
        let r4 = try b.identify("d3", c, ["email": "cee@example.org"])
        #expect(r4["euid"] == .string(c))
        #expect(try b.user(c)["identities"]?["emails"] == ["cee@example.org"])
    }

    @Test(arguments: StoreKind.allCases) func serverSideRejectionsArePerField(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        let e = try b.startEUID("d1")
        let long = String(repeating: "x", count: 257)
        let r = try b.identify(
            "d1", e,
            [
                "user_id": "u1", "anonymous_id": .string(long), "email": "no-at-sign.com", "phone": "+12",
            ])
        #expect(r["code"] == 0)
        #expect(r["euid"] == .string(e))
        let f = try #require(r["fields"])
        #expect(f["user_id"] == ["code": 0])
        #expect(f["anonymous_id"]?["code"] == 3003)
        #expect(f["email"]?["code"] == 3013)
        #expect(f["phone"]?["code"] == 3013)
        #expect(f["email"]?["msg"]?.stringValue != nil)
        #expect(try b.findUser("user_id=u1") == .string(e))

        // Nothing valid: -3 with the per-field results, and nothing changes (not even the device).
        let none = try b.identify(
            "d9", nil,
            [
                "user_id": 5, "email": "a@b", "phone": .string("+" + String(repeating: "1", count: 40)), "anonymous_id": .null,
            ])
        #expect(none["code"] == -3)
        #expect(none["message"] == "no valid identifier")
        #expect(none["fields"]?["user_id"]?["code"] == 3013)
        #expect(none["fields"]?["email"]?["code"] == 3013)
        #expect(none["fields"]?["phone"]?["code"] == 3003)
        #expect(none["fields"]?["anonymous_id"] == nil)
        #expect(try b.findUser("deviceId=d9") == .null)
        // A start with only invalid identifiers proceeds with the device's user.
        #expect(try b.ma("start", ["deviceId": "d9", "identity": ["email": "bad"]])["code"] == 0)
        #expect(try b.findUser("deviceId=d9") != .null)
    }

    // MARK: Contacts and channel values

    @Test(arguments: StoreKind.allCases) func contactsAreStoredPerUserAndNeverChangeTheEUID(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        let e = try b.startEUID("d1")
        func contacts(_ c: JSON) throws -> JSON { try b.ma("contacts", ["euid": .string(e), "contacts": c]) }
        #expect(try contacts(["email": "c@x.io", "mobile_phone": "+15550001"]) == ["code": 0])
        #expect(try contacts(["email": "", "mobile_phone": .null, "whatsapp_phone": "+15550002"]) == ["code": 0])
        let u = try b.user(e)
        #expect(u["contacts"] == ["mobile_phone": "+15550001", "whatsapp_phone": "+15550002"])
        #expect(u["identities"]?["emails"] == [])  // contacts are not identifiers
        #expect(try b.findUser("deviceId=d1") == .string(e))

        #expect(try b.ma("contacts", ["euid": "nobody", "contacts": ["email": "c@x.io"]]) == ["code": -1, "message": "unknown euid"])
        #expect(try b.ma("contacts", ["euid": .string(e), "contacts": ["email": "   "]])["code"] == -3)
        #expect(try b.ma("contacts", ["euid": .string(e), "contacts": ["email": 5]])["code"] == -3)
        #expect(try b.ma("contacts", ["euid": .string(e)])["code"] == -3)
        #expect(try b.user(e)["contacts"] == ["mobile_phone": "+15550001", "whatsapp_phone": "+15550002"])
    }

    @Test(arguments: StoreKind.allCases) func channelValuesAreAppendedInCallOrder(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        let e = try b.startEUID("d1")
        #expect(try b.ma("channel", ["euid": .string(e), "channelId": 3, "values": ["rid-1", "rid-2"]]) == ["code": 0])
        #expect(try b.ma("channel", ["euid": .string(e), "channelId": 7, "values": ["tok"]]) == ["code": 0])
        #expect(try b.ma("channel", ["euid": .string(e), "channelId": 3, "values": ["rid-3"]]) == ["code": 0])
        #expect(
            try b.user(e)["channels"] == [
                ["channelId": 3, "values": ["rid-1", "rid-2"]], ["channelId": 7, "values": ["tok"]],
                ["channelId": 3, "values": ["rid-3"]],
            ])
        #expect(try b.ma("channel", ["euid": "nobody", "channelId": 3, "values": ["x"]])["code"] == -1)
        for bad: JSON in [
            ["euid": .string(e), "channelId": 0, "values": ["x"]],
            ["euid": .string(e), "channelId": "3", "values": ["x"]],
            ["euid": .string(e), "channelId": 3, "values": []],
            ["euid": .string(e), "channelId": 3, "values": [" "]],
        ] {
            #expect(try b.ma("channel", bad)["code"] == -3, "\(bad.serialized)")
        }
        #expect(try b.user(e)["channels"]?.arrayValue?.count == 3)
    }

    // MARK: Properties

    @Test(arguments: StoreKind.allCases) func setOverwritesMergesAndReplaces(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        let e = try b.startEUID("d1")
        let ok: JSON = ["code": 0, "message": "success"]
        #expect(
            try b.prop(
                e,
                [
                    "op": "set",
                    "properties": [
                        "name": "ann", "age": 30, "tags": ["a", "b"], "profile": ["city": "Oslo", "zip": "0150"],
                        "orders": [["id": "o1", "n": 1], ["id": "o2", "gone": .null]],
                    ],
                ]) == ok)
        #expect(
            try b.properties(e) == [
                "name": "ann", "age": 30, "tags": ["a", "b"], "profile": ["city": "Oslo", "zip": "0150"],
                "orders": [["id": "o1", "n": 1], ["id": "o2"]],
            ])
        // Plain types overwrite; objects merge (null deletes); object arrays replace.
        #expect(
            try b.prop(
                e,
                [
                    "op": "set",
                    "properties": [
                        "name": "bo", "age": "thirty", "profile": ["zip": .null, "street": "Main"], "orders": [["id": "o3"]],
                    ],
                ]) == ok)
        #expect(
            try b.properties(e) == [
                "name": "bo", "age": "thirty", "tags": ["a", "b"], "profile": ["city": "Oslo", "street": "Main"],
                "orders": [["id": "o3"]],
            ])
        // An empty array clears an existing array but creates nothing.
        #expect(try b.prop(e, ["op": "set", "properties": ["tags": [], "orders": [], "newlist": []]]) == ok)
        let p = try b.properties(e)
        #expect(p["tags"] == [])
        #expect(p["orders"] == [])
        #expect(p["newlist"] == nil)

        // Invalid content: nothing is set.
        let before = try b.properties(e)
        let cases: [(JSON, Int64)] = [
            (["ok_name": "x", "flag": true], 4005),
            (["ok_name": "x", "gone": .null], 4005),
            (["obj": ["nested": ["a": 1]]], 4005),
            (["obj": [:] as JSON], 4005),
            (["mixed": ["a", ["b": 1]]], 4005),
            (["bad.key": ["x": 1]], 4006),
            (["Upper": 1], 4006),
            (["el_reserved": 1], 4006),
            (["engagelab_x": 1], 4006),
            (.object((0...100).reduce(into: JSONObject()) { o, i in o["p\(i)"] = 1 }), 4007),
        ]
        for (props, code) in cases {
            #expect(try b.prop(e, ["op": "set", "properties": props])["code"] == .int(code), "\(props.serialized)")
        }
        #expect(try b.properties(e) == before)
        #expect(try b.prop(e, ["op": "set", "properties": "nope"])["code"] == -3)
        #expect(try b.prop(e, ["op": "frobnicate"])["code"] == -3)
        #expect(try b.prop("nobody", ["op": "set", "properties": ["a": 1]]) == ["code": -1, "message": "unknown euid"])
    }

    @Test(arguments: StoreKind.allCases) func increaseAddRemoveAndDelete(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        let e = try b.startEUID("d1")
        _ = try b.prop(e, ["op": "set", "properties": ["n": 1, "s": "text", "list": ["a"]]])
        #expect(try b.prop(e, ["op": "increase", "properties": ["n": 2, "m": 1.5, "s": 4]])["code"] == 0)
        var p = try b.properties(e)
        #expect(p["n"] == 3)
        #expect(p["m"] == 1.5)
        #expect(p["s"] == "text")  // non-numeric target ignored
        #expect(try b.prop(e, ["op": "increase", "properties": ["n": 0.5]])["code"] == 0)
        #expect(try b.properties(e)["n"] == 3.5)
        #expect(try b.prop(e, ["op": "increase", "properties": ["n": "1"]])["code"] == 4005)

        #expect(try b.prop(e, ["op": "add", "properties": ["list": ["b", "a", "c"], "fresh": ["x"], "s": ["y"]]])["code"] == 0)
        p = try b.properties(e)
        #expect(p["list"] == ["a", "b", "c"])
        #expect(p["fresh"] == ["x"])
        #expect(p["s"] == "text")  // non-array target ignored
        // A non-string element makes the whole operation ignored.
        #expect(try b.prop(e, ["op": "add", "properties": ["list": ["d", 1]]])["code"] == 0)
        #expect(try b.properties(e)["list"] == ["a", "b", "c"])

        #expect(try b.prop(e, ["op": "remove", "properties": ["list": ["a", "zz"], "missing": ["a"], "s": ["text"]]])["code"] == 0)
        p = try b.properties(e)
        #expect(p["list"] == ["b", "c"])
        #expect(p["missing"] == nil)
        #expect(p["s"] == "text")

        #expect(try b.prop(e, ["op": "delete", "keys": ["list", "n", "never_set"]])["code"] == 0)
        p = try b.properties(e)
        #expect(p["list"] == nil)
        #expect(p["n"] == nil)
        #expect(p["s"] == "text")
        #expect(try b.prop(e, ["op": "delete", "keys": []])["code"] == -3)
    }

    @Test(arguments: StoreKind.allCases) func objectArrayOperationsFollowTheMetadata(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        let meta = try b.post(
            "/v1/admin/ma/app/metadata",
            [
                "properties": [
                    "orders": [
                        "type": "object_array", "identifierKey": "id", "identifierType": "string",
                        "subfields": ["qty": "number", "tags": "string_array", "note": "string"],
                    ],
                    "seats": ["type": "object_array", "identifierKey": "no", "identifierType": "number", "subfields": ["row": "string"]],
                ]
            ])
        let subfields: JSON = ["id": "string", "note": "string", "qty": "number", "tags": "string_array"]
        #expect(meta["properties"]?["orders"]?["subfields"] == subfields)
        #expect(try b.get("/v1/admin/ma/app/metadata") == meta)
        #expect(try b.get("/v1/admin/ma/app")["metadata"] == meta)
        let e = try b.startEUID("d1")
        func update(_ fields: JSONObject, key: String = "orders") throws -> JSON {
            var body: JSONObject = ["op": "updateObjectArray", "key": .string(key), "identifierKey": "id"]
            for (k, v) in fields { body[k] = v }
            return try b.prop(e, .object(body))
        }
        func remove(_ value: JSON, idKey: String = "id", key: String = "orders") throws -> JSON {
            try b.prop(e, ["op": "removeObjectArray", "key": .string(key), "identifierKey": .string(idKey), "identifierValue": value])
        }

        // Undefined in metadata, or no value yet: 0 and nothing changes.
        #expect(try update(["identifierValue": "o1", "values": ["qty": 2]])["code"] == 0)
        #expect(try b.prop(e, ["op": "addObjectArray", "key": "undefined_arr", "object": ["id": "x"]])["code"] == 0)
        #expect(try remove("o1")["code"] == 0)
        #expect(try b.properties(e) == [:] as JSON)

        // add: creates a one-element array, then appends.
        #expect(try b.prop(e, ["op": "addObjectArray", "key": "orders", "object": ["id": "o1", "qty": 1, "note": .null]])["code"] == 0)
        #expect(try b.prop(e, ["op": "addObjectArray", "key": "orders", "object": ["id": "o2", "qty": 2]])["code"] == 0)
        #expect(try b.prop(e, ["op": "addObjectArray", "key": "orders", "object": ["id": "o2", "qty": 9]])["code"] == 0)
        #expect(try b.properties(e)["orders"] == [["id": "o1", "qty": 1], ["id": "o2", "qty": 2], ["id": "o2", "qty": 9]])
        #expect(try b.prop(e, ["op": "addObjectArray", "key": "orders", "object": ["note": .null]])["code"] == 4005)

        // update: merges into the one match (null deletes a subfield).
        #expect(try update(["identifierValue": "o1", "values": ["qty": 5, "tags": ["x"], "note": "hi"]])["code"] == 0)
        #expect(try update(["identifierValue": "o1", "values": ["note": .null]])["code"] == 0)
        let stateAfterUpdates = try b.properties(e)
        #expect(stateAfterUpdates["orders"]?.arrayValue?.first == ["id": "o1", "qty": 5, "tags": ["x"]])

        // Failures change nothing.
        let failures: [(JSONObject, Int64)] = [
            (["identifierValue": "nope", "values": ["qty": 1]], 4001),
            (["identifierValue": "o2", "values": ["qty": 1]], 4002),
            (["identifierValue": 1, "values": ["qty": 1]], 4003),
            (["identifierKey": "qty", "identifierValue": "o1", "values": ["note": "x"]], 4003),
            (["identifierValue": "o1", "values": ["colour": "red"]], 4004),
            (["identifierValue": "o1", "values": ["qty": "five"]], 4004),
            (["identifierValue": "o1", "values": ["id": "o9"]], 4004),
            (["identifierValue": "o1", "values": [:] as JSON], 4005),
            (["identifierValue": "o1", "values": ["qty": ["a": 1]]], 4005),
        ]
        for (fields, code) in failures {
            #expect(try update(fields)["code"] == .int(code), "\(JSON.object(fields).serialized)")
        }
        #expect(try b.properties(e) == stateAfterUpdates)

        // remove: several matches or a type mismatch fail; no match is ignored; one match goes.
        #expect(try remove("o2")["code"] == 4002)
        #expect(try remove(2)["code"] == 4003)
        #expect(try remove("o1", idKey: "qty")["code"] == 4003)
        #expect(try b.properties(e) == stateAfterUpdates)
        #expect(try remove("nope")["code"] == 0)
        #expect(try remove("o1")["code"] == 0)
        #expect(try b.properties(e)["orders"] == [["id": "o2", "qty": 2], ["id": "o2", "qty": 9]])

        // Number identifiers match by value.
        _ = try b.prop(e, ["op": "set", "properties": ["seats": [["no": 1, "row": "a"], ["no": 2, "row": "b"]]]])
        #expect(try update(["identifierKey": "no", "identifierValue": 2.0, "values": ["row": "c"]], key: "seats")["code"] == 0)
        #expect(try update(["identifierKey": "no", "identifierValue": "2", "values": ["row": "c"]], key: "seats")["code"] == 4003)
        #expect(try remove(1, idKey: "no", key: "seats")["code"] == 0)
        #expect(try b.properties(e)["seats"] == [["no": 2, "row": "c"]])

        // Metadata merges; null removes a definition, after which the property is undefined.
        _ = try b.post("/v1/admin/ma/app/metadata", ["properties": ["orders": .null]])
        #expect(try b.get("/v1/admin/ma/app/metadata")["properties"]?["orders"] == nil)
        #expect(try b.get("/v1/admin/ma/app/metadata")["properties"]?["seats"] != nil)
        #expect(try update(["identifierValue": "nope", "values": ["qty": 1]])["code"] == 0)
        let good: JSONObject = ["type": "object_array", "identifierKey": "id", "identifierType": "string"]
        func def(_ change: JSONObject) -> JSON {
            var d = good
            for (k, v) in change { d[k] = v }
            return ["properties": ["x": .object(d)]]
        }
        for bad: JSON in [
            def(["type": "object"]), def(["identifierKey": .null]), def(["identifierType": "bool"]),
            def(["subfields": ["id": "number"]]), def(["subfields": ["a": "object"]]), ["nope": [:] as JSON],
        ] {
            let r = try b.request("POST", "/v1/admin/ma/app/metadata", body: Array(bad.serialized.utf8))
            #expect(r.status == 400, "\(bad.serialized)")
        }
    }

    // MARK: AppKey state

    @Test(arguments: StoreKind.allCases) func disabledAnswersMinus4AndProjectSwitchMinus6(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        let e = try b.startEUID("d1")
        let initial: JSON = ["appKey": "app", "disabled": false, "project": "default", "metadata": ["properties": [:] as JSON]]
        #expect(try b.get("/v1/admin/ma/app") == initial)

        #expect(try b.post("/v1/admin/ma/app", ["disabled": true])["disabled"] == true)
        let disabled: JSON = ["code": -4, "message": "MA is disabled for this project"]
        #expect(try b.ma("start", ["deviceId": "d1"]) == disabled)
        #expect(try b.identify("d1", e, ["user_id": "u"]) == disabled)
        #expect(try b.ma("contacts", ["euid": .string(e), "contacts": ["email": "a@b.c"]]) == disabled)
        #expect(try b.ma("channel", ["euid": .string(e), "channelId": 1, "values": ["x"]]) == disabled)
        #expect(try b.prop(e, ["op": "set", "properties": ["a": 1]]) == disabled)
        #expect(try b.ma("start", ["deviceId": "d1"], app: "other")["code"] == 0)  // per AppKey
        #expect(try b.user(e)["contacts"] == [:] as JSON)
        #expect(try b.post("/v1/admin/ma/app", ["disabled": false])["disabled"] == false)

        // A project switch: calls naming the old project get -6; calls naming none, or the new
        // one, work; start answers the current project.
        #expect(try b.post("/v1/admin/ma/app", ["project": "p2"])["project"] == "p2")
        let switched: JSON = ["code": -6, "message": "project switched"]
        let oldProject: JSON = ["deviceId": "d1", "euid": .string(e), "project": "default", "identity": ["user_id": "u"]]
        #expect(try b.ma("identify", oldProject) == switched)
        #expect(try b.ma("contacts", ["euid": .string(e), "project": "default", "contacts": ["email": "a@b.c"]]) == switched)
        #expect(try b.ma("channel", ["euid": .string(e), "project": "default", "channelId": 1, "values": ["x"]]) == switched)
        #expect(try b.prop(e, ["op": "set", "project": "default", "properties": ["a": 1]]) == switched)
        #expect(try b.properties(e) == [:] as JSON)
        #expect(try b.ma("start", ["deviceId": "d1", "project": "default"]) == ["code": 0, "euid": .string(e), "project": "p2"])
        #expect(try b.prop(e, ["op": "set", "project": "p2", "properties": ["a": 1]])["code"] == 0)
        #expect(try b.prop(e, ["op": "set", "properties": ["b": 2]])["code"] == 0)
        #expect(try b.properties(e) == ["a": 1, "b": 2])
        // Disabled comes before a project mismatch.
        _ = try b.post("/v1/admin/ma/app", ["disabled": true])
        #expect(try b.prop(e, ["op": "set", "project": "default", "properties": ["a": 1]]) == disabled)

        for bad: JSON in [["disabled": "yes"], ["project": ""], ["project": 3], ["colour": "red"], [1]] {
            #expect(try b.request("POST", "/v1/admin/ma/app", body: Array(bad.serialized.utf8)).status == 400, "\(bad.serialized)")
        }
    }

    // MARK: HTTP surface

    @Test(arguments: StoreKind.allCases) func inspectionAndMalformedRequests(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        let e = try b.startEUID("d1")
        #expect(try b.request("GET", "/v1/inspect/ma/app/users/\(e)").status == 200)
        let missing = try b.request("GET", "/v1/inspect/ma/app/users/0123")
        #expect(missing.status == 404)
        #expect(try missing.json()["code"] == "not_found")
        #expect(try b.request("GET", "/v1/inspect/ma/other/users/\(e)").status == 404)
        #expect(try b.request("GET", "/v1/inspect/ma/app/users").status == 400)
        #expect(try b.request("GET", "/v1/inspect/ma/app/users?deviceId=d1&user_id=u").status == 400)
        #expect(try b.request("GET", "/v1/inspect/ma/app/users?colour=red").status == 400)

        #expect(try b.request("GET", "/v1/ma/app/start").status == 405)
        #expect(try b.request("POST", "/v1/ma/app/nothing", body: Array("{}".utf8)).status == 404)
        let badKey = try b.request("POST", "/v1/ma/bad%20key/start", body: Array("{}".utf8))
        #expect(badKey.status == 400)
        #expect(try badKey.json()["code"] == "invalid_request")
        #expect(try b.request("POST", "/v1/ma/\(String(repeating: "k", count: 129))/start", body: Array("{}".utf8)).status == 400)
        let notJSON = try b.request("POST", "/v1/ma/app/start", body: Array("{\"deviceId\":".utf8))
        #expect(notJSON.status == 400)
        #expect(try notJSON.json()["code"] == "invalid_json")
        // Well-formed JSON of the wrong shape is an MA-level -3.
        #expect(try b.ma("start", [1, 2])["code"] == -3)
        #expect(try b.ma("start", ["deviceId": 7])["code"] == -3)
        #expect(try b.ma("start", ["deviceId": "d1", "project": 7])["code"] == -3)
        #expect(try b.ma("identify", ["deviceId": "d1", "euid": 5, "identity": ["user_id": "u"]])["code"] == -3)
        #expect(try b.ma("identify", ["deviceId": "d1"])["code"] == -3)
        // gzip bodies work as for ingest.
        let zipped = try Gzip.compress(Array(#"{"deviceId":"d1"}"#.utf8))
        let gz = try b.request("POST", "/v1/ma/app/start", headers: [("Content-Encoding", "gzip")], body: zipped)
        #expect(try gz.json()["euid"] == .string(e))
    }

    @Test(arguments: StoreKind.allCases) func faultsApplyToMACallsButNotToAdminOrInspection(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        try b.setFaults(["failNext": 1, "status": 503, "retryAfter": 2])
        let admin = try b.request("POST", "/v1/admin/ma/app", body: Array(#"{"project":"p"}"#.utf8))
        #expect(admin.status == 200)
        let failed = try b.request("POST", "/v1/ma/app/start", body: Array(#"{"deviceId":"d1"}"#.utf8))
        #expect(failed.status == 503)
        #expect(failed.headers["retry-after"] == "2")
        #expect(try b.findUser("deviceId=d1") == .null)  // nothing stored
        let e = try b.startEUID("d1")
        #expect(try b.findUser("deviceId=d1") == .string(e))

        // Reset forgets MA data and state too.
        #expect(try b.request("POST", "/v1/admin/reset").status == 200)
        #expect(try b.findUser("deviceId=d1") == .null)
        #expect(try b.get("/v1/admin/ma/app")["project"] == "default")
    }

    @Test(arguments: StoreKind.allCases) func identitiesSurviveARestartWithADatabaseFile(_ store: StoreKind) throws {
        let dir = NSTemporaryDirectory() + "pylon-backend-ma-db-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let db = try store.databaseArguments(sqliteFile: dir + "/backend.sqlite")
        let e: String
        do {
            let b = try BackendProcess(database: db)
            e = try b.startEUID("d1")
            _ = try b.identify("d1", e, ["user_id": "u1"])
            _ = try b.prop(e, ["op": "set", "properties": ["a": 1]])
            #expect(b.stop() == 0)
        }
        let b = try BackendProcess(database: db)
        #expect(try b.ma("start", ["deviceId": "d2", "identity": ["user_id": "u1"]])["euid"] == .string(e))
        #expect(try b.properties(e) == ["a": 1])
    }
}

// MARK: Helpers

extension BackendProcess {
    /// POSTs `body` as JSON; the reply body, which must come with 200.
    func post(_ target: String, _ body: JSON) throws -> JSON {
        let r = try request("POST", target, body: Array(body.serialized.utf8))
        guard r.status == 200 else { throw TestFailure(description: "POST \(target): \(r.status) \(r.text)") }
        return try r.json()
    }

    /// `POST /v1/ma/{app}/{call}`.
    func ma(_ call: String, _ body: JSON, app: String = "app") throws -> JSON {
        try post("/v1/ma/\(app)/\(call)", body)
    }

    /// `POST /v1/ma/{app}/identify` from `device` with current `euid` (nil: null).
    func identify(_ device: String, _ euid: String?, _ identity: JSON, app: String = "app") throws -> JSON {
        try ma("identify", ["deviceId": .string(device), "euid": euid.map(JSON.string) ?? .null, "identity": identity], app: app)
    }

    /// A properties call for `euid`: `fields` plus the euid.
    func prop(_ euid: String, _ fields: JSON) throws -> JSON {
        var body = fields.objectValue ?? JSONObject()
        body["euid"] = .string(euid)
        return try ma("properties", .object(body))
    }

    /// The EUID a plain start of `device` answers.
    func startEUID(_ device: String, app: String = "app") throws -> String {
        let r = try ma("start", ["deviceId": .string(device)], app: app)
        guard r["code"] == 0, let e = r["euid"]?.stringValue else { throw TestFailure(description: "start: \(r.serialized)") }
        return e
    }

    func user(_ euid: String, app: String = "app") throws -> JSON { try get("/v1/inspect/ma/\(app)/users/\(euid)") }

    func properties(_ euid: String, app: String = "app") throws -> JSON {
        try user(euid, app: app)["properties"] ?? .null
    }

    /// `GET /v1/inspect/ma/{app}/users?{query}`: the EUID or null.
    func findUser(_ query: String, app: String = "app") throws -> JSON {
        try get("/v1/inspect/ma/\(app)/users?\(query)")["euid"] ?? .null
    }
}
