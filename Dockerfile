# The kit's runtime image: PD proxy, expert balancer, engine simulator and post-deploy checks,
# all behind the `ascend-deploy` CLI. Not the engine image (that is vLLM-Ascend's).
# `pulumi up` builds and pushes it when the stack's kubernetes.runtime_image is a build (docs/kubernetes.md,
# "Runtime image"; .dockerignore is the context). By hand, for a kind stack that runs a `kind load`-ed image:
#   docker build -t ascend-deploy-runtime:dev .
#   kind load docker-image ascend-deploy-runtime:dev --name ascend
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md requirements.lock ./
COPY ascend_runtime ./ascend_runtime
RUN pip wheel --no-cache-dir --wheel-dir /wheels -c requirements.lock .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# the launch/dashboard templates some commands render
COPY templates /opt/ascend-deploy/templates
ENV ASCEND_DEPLOY_TEMPLATES=/opt/ascend-deploy/templates
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin ascend
USER 10001
EXPOSE 8000 9000 9100
ENTRYPOINT []
CMD ["ascend-deploy", "--help"]
