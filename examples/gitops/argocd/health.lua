-- Argo CD health check for bertjob.dev/BertPretrainJob: the value of
-- resource.customizations.health.bertjob.dev_BertPretrainJob in argocd-cm (kustomization.yaml
-- here puts it there). Argo CD runs it with the live object as `obj` (Lua 5.1, gopher-lua).
--
-- It reads the kstatus conditions the operator derives from the rest of the status
-- (docs/operator.md, "Status for GitOps tools"), then, for a status written before the operator
-- wrote them, the phase:
--   no status yet, or a spec generation not yet handled, Reconciling=True: Progressing
--   Stalled=True (a failed job, a refused spec change):                    Degraded
--   Ready=True (training runs, or it succeeded):                           Healthy
--   phase Suspended (spec.runPolicy.suspend):                              Suspended
--   anything else:                                                         Unknown
local hs = {}

local function said(condition)
  if condition.message ~= nil and condition.message ~= "" then
    return condition.reason .. ": " .. condition.message
  end
  return condition.reason
end

if obj.status == nil then
  -- Just created: the operator writes the first status once it has made the children.
  hs.status = "Progressing"
  hs.message = "Waiting for the bertjob operator"
  return hs
end

local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and observed ~= nil and observed < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to apply spec generation " .. generation
  return hs
end

local conditions = {}
if obj.status.conditions ~= nil then
  for _, condition in ipairs(obj.status.conditions) do
    conditions[condition.type] = condition
  end
end

local function holds(kind)
  return conditions[kind] ~= nil and conditions[kind].status == "True"
end

if holds("Stalled") then
  hs.status = "Degraded"
  hs.message = said(conditions.Stalled)
  return hs
end
if holds("Reconciling") then
  hs.status = "Progressing"
  hs.message = said(conditions.Reconciling)
  return hs
end
if holds("Ready") then
  hs.status = "Healthy"
  hs.message = said(conditions.Ready)
  return hs
end

-- No kstatus conditions (a status written by an operator older than them): the phase.
local phase = obj.status.phase
if phase == "Suspended" then
  hs.status = "Suspended"
  hs.message = "spec.runPolicy.suspend is true"
elseif phase == "Failed" then
  hs.status = "Degraded"
  hs.message = "Failed"
  if conditions.Failed ~= nil then
    hs.message = said(conditions.Failed)
  end
elseif phase == "Pending" or phase == "Preparing" then
  hs.status = "Progressing"
  hs.message = phase
elseif phase == "Running" or phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = phase
else
  hs.status = "Unknown"
  hs.message = "No phase the bertjob operator writes: " .. tostring(phase)
end
return hs
