-- DDL of CUPTI_ACTIVITY_KIND_GRAPH_TRACE as Nsight Systems 2024.x writes it (export schema 3.16.1), copied from NVIDIA's SQLite schema reference (Nsight Systems User Guide, "SQLite Schema Reference"). One row per whole CUDA graph execution, written with `nsys profile --cuda-graph-trace=graph` (the graph's kernels are then not in CUPTI_ACTIVITY_KIND_KERNEL); correlationId matches the launching cudaGraphLaunch call in CUPTI_ACTIVITY_KIND_RUNTIME. nsys 2022.4 (nsys-schema-2022.4.2.sql) has no such table.
CREATE TABLE CUPTI_ACTIVITY_KIND_GRAPH_TRACE (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER   NOT NULL,                    -- Event end timestamp (ns).
    deviceId                    INTEGER   NOT NULL,                    -- Device ID.
    contextId                   INTEGER   NOT NULL,                    -- Context ID.
    greenContextId              INTEGER,                               -- Green context ID.
    streamId                    INTEGER   NOT NULL,                    -- Stream ID.
    correlationId               INTEGER,                               -- REFERENCES CUPTI_ACTIVITY_KIND_RUNTIME(correlationId)
    globalPid                   INTEGER,                               -- Serialized GlobalId.
    graphId                     INTEGER   NOT NULL,                    -- REFERENCES CUDA_GRAPH_EVENTS(graphId)
    graphExecId                 INTEGER   NOT NULL                     -- REFERENCES CUDA_GRAPH_EVENTS(graphExecId)
);
